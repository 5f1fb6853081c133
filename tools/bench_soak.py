"""``kvfs bench soak``: mixed load on a real mount, every byte read checked, faults on a
schedule, the daemon's memory and descriptors watched.

Mounts kvfs in a temporary directory with small tiers (so eviction runs all the time): DRAM
over disk over a shared posix tier (a stallfs mount that can be stalled), two tenants
(namespaces ``tenant-a`` and ``tenant-b`` with DRAM quotas) and KV events published (a ZMQ
subscriber counts them). For ``--minutes`` (or ``--seconds``) it runs at once:

- **writers** that publish new versions of a pool of shared names, each write with one of
  the patterns real programs use: plain ``open("wb")``; a temp name then ``os.replace``;
  a temp name renamed while still open (safetensors); a ``dup`` closed mid-write; a child
  process inheriting the descriptor and closing it after the parent (the last close is the
  child's); a rewrite without ``O_TRUNC`` (LMCache); an ``fsync`` mid-write; and now and
  then an ``unlink``. Writers of one name take turns (a lock per name): a rewrite that
  opened a name while another writer was still writing it (a name with no block yet, or
  just unlinked) would join that file (docs/SEMANTICS.md line 15: every descriptor writes
  the same file), and the mix of the two is not one whole version, which is what the
  readers require;
- **close-to-open checkers**: writers of names of their own that read each file back the
  moment ``close`` returned and require exactly what they wrote;
- **readers** that open and read shared names and check every byte: each version carries
  a header (name, version, length) and its payload is derived from it, so a read must be
  one whole version of that name — a partial, torn, mixed or foreign block is a *wrong
  read*, and so is an ``fstat`` size that is not the version's;
- **listers** listing the directories;
- **batch clients** (tenant-b) putting and reading versions of their own names, every byte
  checked the same way (tools/soak_parts.py);
- **faults**, one per ``--fault-every`` seconds in turn: a client holding leases and
  reservations SIGKILLed, the posix tier stalled, a byte of a disk block file flipped, a
  flood of connections (tools/soak_parts.py).

The FUSE load is in tenant-a. A missing name (never written, evicted, unlinked) is a miss,
not an error; so is a block whose only copy is in the stalled tier (``EHOSTDOWN``) and a
write refused for room (``ENOSPC``): each is counted. The daemon's RSS and descriptors are
sampled every 10 s; after the warm-up (``--warmup``, default a fifth of the run, at least
2 minutes when the run is long enough) the RSS slope is fitted (aim: under 1 MiB/min) and
the descriptors' range reported. Prints the figures (``--json`` for a JSON object) and
exits non-zero on any wrong read, close-to-open failure, unexpected error, a daemon that
died, or leases or reservations still held after every client is gone.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from .flags import duration, positive_int, seconds
from .render import table
from .scratch import mount, umount
from .soak_parts import ClientLoad, EventCounter, Faults, Sampler, slope

MiB = 1 << 20
_MAGIC = b"KVSOAK01"
_HEADER = struct.Struct("<8sQQ48s")  # magic, version, length, name
PATTERNS = ("plain", "replace", "rename-open", "dup", "child", "rewrite", "fsync")
"""How writes are made; ``fsync`` (publish with fsync, read back before close) is only
used on the close-to-open checkers' own names."""


def _minutes(text: str) -> float:
    """A number of minutes, more than 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of minutes more than 0 (got {text!r})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=seconds(), default=180.0, help="how long to run (default 180)")
    parser.add_argument(
        "--minutes", type=_minutes, default=None, help="how long to run, in minutes (overrides --seconds)"
    )
    parser.add_argument(
        "--fault-every", type=duration, default=300.0, help="seconds between faults (default 300; 0: none)"
    )
    parser.add_argument(
        "--stall", type=seconds(), default=30.0, help="how long a stall of the posix tier lasts (default 30)"
    )
    parser.add_argument("--warmup", type=seconds(), default=None, help="seconds left out of the RSS slope")
    parser.add_argument("--clients", type=positive_int, default=2, help="batch-client workers (default 2)")
    parser.add_argument("--writers", type=positive_int, default=4, help="writer threads on shared names (default 4)")
    parser.add_argument("--readers", type=positive_int, default=4, help="reader threads (default 4)")
    parser.add_argument("--names", type=positive_int, default=64, help="shared names (default 64)")
    parser.add_argument("--dram", default="48MiB", help="DRAM tier capacity (default 48MiB)")
    parser.add_argument("--disk", default="160MiB", help="disk tier capacity (default 160MiB)")
    parser.add_argument("--dir", default=None, help="where to mount and keep the disk tier (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def make_version(name: str, version: int, size: int) -> bytes:
    """A version of *name*: a header saying what it is, then bytes derived from it."""
    head = _HEADER.pack(_MAGIC, version, size, name.encode()[:48])
    body_len = size - len(head)
    seed = xxhash.xxh3_64_intdigest(head)
    return head + random.Random(seed).randbytes(body_len)


def check_version(name: str, data: bytes) -> str | None:
    """None if *data* is one whole version of *name*, else what is wrong with it."""
    if len(data) < _HEADER.size:
        return f"{len(data)} bytes: shorter than a header"
    magic, version, size, who = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        return "no header: foreign or torn bytes"
    who = who.rstrip(b"\0")
    if who != name.encode()[:48]:
        return f"the block of {who.decode(errors='replace')!r}"
    if size != len(data):
        return f"version {version} is {size} bytes, read {len(data)}"
    if data != make_version(name, version, size):
        return f"version {version}: payload differs (torn or mixed)"
    return None


@dataclass
class Figures:
    lock: threading.Lock = field(default_factory=threading.Lock)
    writes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATTERNS, 0))
    unlinks: int = 0
    bytes_written: int = 0
    reads: int = 0
    bytes_read: int = 0
    misses: int = 0
    unavailable: int = 0
    nospace: int = 0
    wrong: list[str] = field(default_factory=list)
    c2o_checks: int = 0
    c2o_failures: list[str] = field(default_factory=list)
    listings: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, **kw: int) -> None:
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)


class Soak:
    def __init__(self, mp: Path, args: argparse.Namespace, prefix: str = "s") -> None:
        self.mp = mp
        self.args = args
        self.prefix = prefix
        self.fig = Figures()
        self.stop = threading.Event()
        self.names = [f"{prefix}/{i % 8:02x}/blk{i:03d}" for i in range(args.names)]
        self._version = 0
        self._vlock = threading.Lock()
        self._name_locks = {n: threading.Lock() for n in self.names}
        for d in {n.rpartition("/")[0] for n in self.names}:
            os.makedirs(mp / d, exist_ok=True)

    def next_version(self) -> int:
        with self._vlock:
            self._version += 1
            return self._version

    def expected(self, exc: OSError) -> bool:
        """Count an expected refusal (a miss, a block only in a stalled tier, no room)."""
        key = {errno.ENOENT: "misses", errno.EHOSTDOWN: "unavailable", errno.ENOSPC: "nospace"}.get(exc.errno or 0)
        if key is None:
            return False
        self.fig.add(**{key: 1})
        return True

    def guard(self, what: str, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except OSError as exc:
            if not self.expected(exc):
                with self.fig.lock:
                    self.fig.errors.append(f"{what}: {exc}")

    # -- writing -------------------------------------------------------------------

    def write(self, rng: random.Random, name: str, pattern: str) -> bytes:
        data = make_version(name, self.next_version(), rng.choice([96 * 1024, 700_000, MiB + 4097, 2 * MiB + 1]))
        path = self.mp / name
        tmp = path.parent / f".{name.rpartition('/')[2]}.{rng.getrandbits(32):08x}.tmp"
        half = len(data) // 2
        if pattern == "plain":
            with open(path, "wb") as f:
                f.write(data)
        elif pattern == "replace":
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        elif pattern == "rename-open":
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, len(data))
            os.pwrite(fd, data, 0)
            os.rename(tmp, path)
            os.close(fd)
        elif pattern == "dup":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data[:half])
            os.close(os.dup(fd))  # an early close of a copy: must publish nothing
            os.write(fd, data[half:])
            os.close(fd)
        elif pattern == "child":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data[:half])
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.05)"], pass_fds=[fd])
            os.write(fd, data[half:])
            os.close(fd)  # the child's exit is the last close
            child.wait()
        elif pattern == "rewrite":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT)  # no O_TRUNC: from the old bytes
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            os.close(fd)
        elif pattern == "fsync":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data)
            os.fsync(fd)  # published now: it must read back before the close
            got = (self.mp / name).read_bytes()
            os.close(fd)
            if got != data:
                with self.fig.lock:
                    self.fig.c2o_failures.append(f"{name} after fsync: {check_version(name, got) or 'older'}")
        self.fig.add(bytes_written=len(data))
        with self.fig.lock:
            self.fig.writes[pattern] += 1
        return data

    def writer(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            name = rng.choice(self.names)
            if rng.random() < 0.03:
                self.guard("unlink", os.unlink, self.mp / name)
                self.fig.add(unlinks=1)
                continue
            pattern = rng.choice(PATTERNS[:-1])
            with self._name_locks[name]:  # one writer of a name at a time (module doc)
                self.guard(f"write ({pattern})", self.write, rng, name, pattern)

    def own_writer(self, seed: int) -> None:
        """Writes names nobody else writes and reads each back right after its close."""
        rng = random.Random(seed)
        own = [f"{self.prefix}/own/w{seed}/f{i}" for i in range(8)]
        os.makedirs(self.mp / f"{self.prefix}/own/w{seed}", exist_ok=True)
        while not self.stop.is_set():
            name = rng.choice(own)
            pattern = rng.choice(PATTERNS)
            try:
                data = self.write(rng, name, pattern)
                got = (self.mp / name).read_bytes()
            except OSError as exc:
                if not self.expected(exc):  # evicted between the close and the read: a miss
                    with self.fig.lock:
                        self.fig.errors.append(f"own {pattern}: {exc}")
                continue
            self.fig.add(c2o_checks=1)
            if got != data:
                why = check_version(name, got) or "an older version"
                with self.fig.lock:
                    self.fig.c2o_failures.append(f"{name} after {pattern}: {why}")

    # -- reading -------------------------------------------------------------------

    def reader(self, seed: int) -> None:
        rng = random.Random(seed)
        buf = bytearray(2 * MiB + 4096)
        while not self.stop.is_set():
            name = rng.choice(self.names)
            try:
                with open(self.mp / name, "rb", buffering=0) as f:
                    size = os.fstat(f.fileno()).st_size
                    n = 0
                    while True:  # small reads now and then: a reader spanning a replacement
                        k = f.readinto(memoryview(buf)[n : n + rng.choice([4096, 65536, len(buf)])])
                        if not k:
                            break
                        n += k
                    data = bytes(buf[:n])
            except OSError as exc:
                if not self.expected(exc):
                    with self.fig.lock:
                        self.fig.errors.append(f"read {name}: {exc}")
                continue
            why = check_version(name, data)
            if why is None and size != len(data):
                why = f"fstat says {size} bytes for a version of {len(data)}"
            self.fig.add(reads=1, bytes_read=len(data))
            if why is not None:
                with self.fig.lock:
                    self.fig.wrong.append(f"{name}: {why}")

    def lister(self, seed: int) -> None:
        rng = random.Random(seed)
        dirs = sorted({n.rpartition("/")[0] for n in self.names})
        while not self.stop.is_set():
            self.guard("listdir", os.listdir, self.mp / rng.choice(dirs))
            self.fig.add(listings=1)
            time.sleep(0.01)

    def jobs(self) -> list[tuple[Any, int]]:
        a = self.args
        return (
            [(self.writer, i) for i in range(a.writers)]
            + [(self.own_writer, 100 + i) for i in range(2)]
            + [(self.reader, 200 + i) for i in range(a.readers)]
            + [(self.lister, 300)]
        )

    def run(self, extra: Sequence[tuple[Any, tuple[Any, ...]]] = (), progress: Any = None) -> None:
        """Run the load (and *extra* ``(fn, args)`` threads, each given the stop event
        last) for ``args.seconds``; *progress()* is printed every 10 s."""
        a = self.args
        threads = [threading.Thread(target=fn, args=(seed,), daemon=True) for fn, seed in self.jobs()]
        threads += [threading.Thread(target=fn, args=(*args, self.stop), daemon=True) for fn, args in extra]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < a.seconds:
                time.sleep(min(10.0, max(0.0, a.seconds - (time.monotonic() - t0))))
                if not a.json:
                    f = self.fig
                    line = (
                        f"  {time.monotonic() - t0:5.0f} s: {sum(f.writes.values()):,} writes, {f.reads:,} reads, "
                        f"{len(f.wrong)} wrong, {len(f.c2o_failures)} close-to-open failures"
                    )
                    print(line + (progress() if progress else ""), file=sys.stderr, flush=True)
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=60)


def _store_figures(mp: Path) -> dict[str, Any]:
    from kvfs.mount.paths import control_socket_path
    from kvfs.protocol import Top, TopResult

    from .control_client import ControlClient

    with ControlClient(control_socket_path(mp)) as c:
        top = c.request(Top(), TopResult).to_json()
    tiers = top["statistics"]["tiers"]
    ops = {o["op"]: o for o in top["ops"]}
    return {
        "evictions": sum(t["evictions"] for t in tiers),
        "demotions": sum(t["demotions"] for t in tiers),
        "corrupt_copies": sum(t["corrupt"] for t in tiers),
        "tier_errors": {t["name"]: t["errors"] for t in tiers},
        "unhealthy_at_end": [t["name"] for t in tiers if not t["healthy"]],
        "seals": ops.get("seal", {}).get("count", 0),
        "seal_failures": ops.get("seal", {}).get("errors", 0),
        "held_leases": top["statistics"]["leases"],
        "held_reserved": top["statistics"]["reserved"],
    }


SOAK_CONFIG = """\
[[tiers]]
kind = "dram"
capacity = "{dram}"
mlock = false
prefault = false

[[tiers]]
kind = "disk"
capacity = "{disk}"
path = "{base}/disk"

[[tiers]]
kind = "posix"
capacity = "4GiB"
path = "{shared}/blocks"
write = "back"
timeout = "2s"

[events]
zmq = "ipc://{base}/events"
audience = "owner"

[[namespaces]]
path = "tenant-a"
quota = {{ dram = "{quota}" }}

[[namespaces]]
path = "tenant-b"
quota = {{ dram = "{quota}" }}
"""


def run(args: argparse.Namespace) -> int:
    from kvfs.units import parse_size

    from .stallfs import StallingMount

    if args.minutes is not None:
        args.seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else max(min(120.0, args.seconds / 2), args.seconds / 5)
    base = Path(tempfile.mkdtemp(prefix="kvfs-bench-soak-", dir=args.dir))
    mp = base / "mnt"
    load = os.getloadavg()[0]
    stall = StallingMount(base / "stall")
    try:
        cfg = base / "soak.toml"
        quota = f"{parse_size(args.dram) * 3 // 5 >> 20}MiB"
        cfg.write_text(
            SOAK_CONFIG.format(dram=args.dram, disk=args.disk, base=base, shared=stall.mountpoint, quota=quota)
        )
        pid = mount(mp, cfg)
        try:
            soak = Soak(mp, args, prefix="tenant-a")
            clients = ClientLoad(mp, "tenant-b", make_version, check_version)
            events = EventCounter(f"ipc://{base}/events")
            sampler = Sampler(pid)
            faults = Faults(mp, "tenant-b", base / "disk", stall, every=args.fault_every, stall_for=args.stall)
            t0 = time.monotonic()
            extra: list[tuple[Any, tuple[Any, ...]]] = [(clients.worker, (i,)) for i in range(args.clients)]
            extra += [(events.run, ()), (sampler.run, (t0,))]
            if args.fault_every > 0:
                extra.append((faults.run, (t0,)))
            if not args.json:
                print(
                    f"kvfs bench soak: {args.seconds:.0f} s on {mp} (load average {load:.2f}), faults every "
                    f"{args.fault_every:.0f} s",
                    file=sys.stderr,
                )

            def progress() -> str:
                rss = f", daemon RSS {sampler.samples[-1][1] / MiB:.0f} MiB" if sampler.samples else ""
                return f"; client {clients.reads:,} reads, {len(clients.wrong)} wrong{rss}"

            soak.run(extra, progress)
            seconds = time.monotonic() - t0
            alive = os.path.exists(f"/proc/{pid}")
            store = _store_figures(mp) if alive else {}
        finally:
            umount(mp)
    finally:
        stall.close()
        shutil.rmtree(base, ignore_errors=True)
    f = soak.fig
    steady = sampler.after(warmup)
    rss_slope = slope([(t / 60, rss / MiB) for t, rss, _ in steady])
    result = {
        "seconds": seconds,
        "load": load,
        "warmup": warmup,
        "writes": dict(f.writes),
        "unlinks": f.unlinks,
        "bytes_written": f.bytes_written,
        "reads": f.reads,
        "bytes_read": f.bytes_read,
        "misses": f.misses,
        "unavailable": f.unavailable,
        "nospace": f.nospace,
        "wrong_reads": len(f.wrong) + len(clients.wrong),
        "client_puts": clients.puts,
        "client_reads": clients.reads,
        "client_misses": clients.misses,
        "client_errors": clients.sessions_cut,
        "close_to_open_checks": f.c2o_checks,
        "close_to_open_failures": len(f.c2o_failures),
        "listings": f.listings,
        "errors": len(f.errors),
        "events": {"messages": events.messages, "events": events.events, "resyncs": events.resyncs},
        "faults": faults.log,
        "daemon_alive": alive,
        "rss_mib": [round(rss / MiB, 1) for _, rss, _ in sampler.samples],
        "rss_slope_mib_per_min": rss_slope,
        "fds": [fds for _, _, fds in steady],
        "fds_start_end": [steady[0][2], steady[-1][2]] if steady else [],
        **store,
        "examples": (f.wrong + clients.wrong + f.c2o_failures + f.errors + clients.errors)[:10],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    held = store.get("held_leases", 0) + store.get("held_reserved", 0)
    bad = result["wrong_reads"] or f.c2o_failures or f.errors or not alive or held
    return 1 if bad else 0


def _print(r: dict[str, Any]) -> None:
    fds = r["fds"] or [0]
    rows = [
        ("writes", f"{sum(r['writes'].values()):,}", ", ".join(f"{k} {v:,}" for k, v in r["writes"].items() if v)),
        ("unlinks", f"{r['unlinks']:,}", ""),
        ("bytes written", f"{r['bytes_written'] / 1e9:.2f} GB", f"{r['bytes_written'] / r['seconds'] / 1e6:.0f} MB/s"),
        ("reads checked", f"{r['reads']:,}", f"{r['bytes_read'] / 1e9:.2f} GB"),
        ("misses (ENOENT)", f"{r['misses']:,}", "evicted, unlinked or not written yet"),
        ("unavailable (EHOSTDOWN)", f"{r['unavailable']:,}", "only in the stalled posix tier"),
        ("no room (ENOSPC)", f"{r['nospace']:,}", "write buffers or a tenant's quota full"),
        ("client puts / reads", f"{r['client_puts']:,} / {r['client_reads']:,}", f"{r['client_misses']:,} misses"),
        ("wrong reads", f"{r['wrong_reads']:,}", "partial, torn, mixed or foreign bytes; wrong size (FUSE + client)"),
        ("close-to-open checks", f"{r['close_to_open_checks']:,}", f"{r['close_to_open_failures']} failed"),
        ("listings", f"{r['listings']:,}", ""),
        ("evictions", f"{r.get('evictions', 0):,}", f"{r.get('demotions', 0):,} demotions"),
        ("corrupt copies dropped", f"{r.get('corrupt_copies', 0):,}", "the flipped bytes, never read"),
        ("seals", f"{r.get('seals', 0):,}", f"{r.get('seal_failures', 0)} failed"),
        (
            "KV events",
            f"{r['events']['events']:,}",
            f"{r['events']['messages']:,} messages, {r['events']['resyncs']} resyncs",
        ),
        ("unexpected errors", f"{r['errors']:,}", f"client sessions cut: {r['client_errors']}"),
        (
            "held after",
            f"{r.get('held_leases', '-')} leases, {r.get('held_reserved', '-')} reserved",
            "every client gone",
        ),
        (
            "daemon RSS slope",
            f"{r['rss_slope_mib_per_min']:+.2f} MiB/min",
            f"after {r['warmup']:.0f} s of warm-up (aim < 1)",
        ),
        (
            "daemon RSS",
            f"{r['rss_mib'][0] if r['rss_mib'] else 0} -> {r['rss_mib'][-1] if r['rss_mib'] else 0} MiB",
            "",
        ),
        (
            "daemon descriptors",
            f"{min(fds)}-{max(fds)}",
            f"after the warm-up (first and last sample: {r['fds_start_end']})",
        ),
        ("tier errors", json.dumps(r.get("tier_errors", {})), f"unhealthy at the end: {r.get('unhealthy_at_end', [])}"),
    ]
    print(f"kvfs bench soak: {r['seconds']:.0f} s, load average {r['load']:.2f} at the start")
    print(table(["", "count", ""], rows, right=[1]))
    for line in r["faults"]:
        print(f"  fault at {line}")
    for e in r["examples"]:
        print(f"  ! {e}")
    verdict = r["wrong_reads"] + r["close_to_open_failures"] + r["errors"]
    ok = not verdict and r["daemon_alive"] and not (r.get("held_leases") or r.get("held_reserved"))
    print("OK: every read was one whole version" if ok else "FAILED")
