"""``kvfs bench fuse``: plain file I/O through a kvfs mount, next to the ceiling and tmpfs.

Mounts, in the same run and each in its own temporary directory: kvfs itself (a DRAM
tier sized to hold the working set over a disk tier), the *ceiling* (a minimal in-memory
pyfuse3 filesystem, :mod:`kvfs.mount.ceiling`: what any Python FUSE daemon costs here)
and a directory of /dev/shm (tmpfs). The same I/O runs on each:

- sequential write and read GB/s of 2 MiB blocks (one file each: open, write, close);
  reads *cold* (the first read after the write) and *repeated* (read again);
- open+read+close latency of small (4 KiB) blocks, p50 and p99, and p50 again once every
  name has been idle 1.5 s (past the kernel's 1 s caches);
- stat() per second of existing names, and of a missing name (a miss: the negative
  lookups an engine's "is this block cached?" makes);
- creating and listing a directory of 100k entries (``--quick``: 10k).

Prints each figure for kvfs, the ceiling and tmpfs, and kvfs's ratio to both (``--json``
for one JSON object). ``--settings`` also compares per-file FUSE settings (keep_cache,
direct_io) by mounting kvfs once per variant (through ``$KVFS_FUSE_OPTIONS``).
``--rss-rounds N`` writes and reads the working set N more times and reports the daemon's
private memory (RssAnon, i.e. beyond its shared-memory DRAM arena) before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .flags import at_least, positive_int
from .scratch import dram_disk_config, mount, umount

MiB = 1 << 20
BLOCK = 2 * MiB

VARIANTS: dict[str, dict[str, Any]] = {
    "default (keep_cache, page cache)": {},
    "no keep_cache": {"keep_cache": False},
    "direct_io reads": {"direct_io_read": True, "keep_cache": False},
    "direct_io writes": {"direct_io_write": True},
    "no keep_cache, 128 KiB read-ahead": {"keep_cache": False, "read_ahead_kb": 0},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--blocks", type=positive_int, default=None, help="2 MiB blocks per pass (default 128; quick 48)"
    )
    parser.add_argument(
        "--entries", type=positive_int, default=None, help="directory entries to list (default 100000; quick 10000)"
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run (CI, shared machines)")
    parser.add_argument("--settings", action="store_true", help="also compare per-file FUSE settings")
    parser.add_argument(
        "--rss-rounds", type=at_least(0), default=0, metavar="N", help="measure daemon memory over N more passes"
    )
    parser.add_argument(
        "--transport",
        default="auto",
        choices=["auto", "kernel", "pyfuse3"],
        help="kvfs's FUSE transport ([mount] transport; default auto)",
    )
    parser.add_argument(
        "--ceiling-transport",
        default="pyfuse3",
        choices=["pyfuse3", "kernel"],
        help="the ceiling filesystem's transport (default pyfuse3: what any pyfuse3 daemon costs)",
    )
    parser.add_argument(
        "--lean", action="store_true", help="a DRAM tier without prefault and mlock (faster to mount, slower seals)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", default=None, help="where to make the mountpoint and disk tier (default: a temp dir)")


# -- workloads (the same code runs on both directories) ---------------------------------


def _payloads(n: int) -> list[bytes]:
    base = os.urandom(BLOCK)
    return [base[i % 97 :] + base[: i % 97] for i in range(min(n, 8))]


def write_blocks(d: Path, n: int, payloads: list[bytes]) -> float:
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(n):
        with open(d / f"blk{i:05d}", "wb", buffering=0) as f:
            f.write(payloads[i % len(payloads)])
    return n * BLOCK / (time.perf_counter() - t0) / 1e9


def read_blocks(d: Path, n: int, buf: bytearray) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        with open(d / f"blk{i:05d}", "rb", buffering=0) as f:
            got = f.readinto(buf)
            assert got == BLOCK, got
    return n * BLOCK / (time.perf_counter() - t0) / 1e9


def read_files(paths: list[Path], buf: bytearray) -> float:
    """GB/s of open, read whole, close of each of *paths* (each a block of ``len(buf)``)."""
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            got = f.readinto(buf)
            assert got == len(buf), (p, got)
    return len(paths) * len(buf) / (time.perf_counter() - t0) / 1e9


def disk_first_reads(mp: Path, disk: Path, n: int, payloads: list[bytes]) -> tuple[float, float, float]:
    """(GB/s of the first reads through the mount, of the second, of the same files read
    directly): blocks written through the mount, then evicted from DRAM (only the disk
    tier holds them), read through the mount twice, and the disk tier's files of the same
    blocks read the same way. All from the page cache of those files (the daemon wrote
    them): the cost measured is the mount's, not the device's."""
    d = mp / "disk-first"
    write_blocks(d, n, payloads)
    names = [f"disk-first/blk{i:05d}" for i in range(n)]
    subprocess.run(
        [sys.executable, "-m", "kvfs.tools.cli", "evict", "--tier", "dram", str(d)],
        capture_output=True,
        check=True,
        timeout=600,
    )
    buf = bytearray(BLOCK)
    first = read_files([mp / nm for nm in names], buf)
    again = read_files([mp / nm for nm in names], buf)
    direct = max(read_files([disk / "blocks" / nm for nm in names], buf) for _ in range(2))
    return first, again, direct


def small_latency(d: Path, n: int) -> tuple[float, float]:
    d.mkdir(parents=True, exist_ok=True)
    data = os.urandom(4096)
    for i in range(n):
        with open(d / f"s{i:05d}", "wb") as f:
            f.write(data)
    buf = bytearray(4096)
    for i in range(n):  # warm: names and attributes cached, as in steady state
        with open(d / f"s{i:05d}", "rb", buffering=0) as f:
            f.readinto(buf)
    lat = _timed_reads(d, n, buf)
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


def _timed_reads(d: Path, n: int, buf: bytearray) -> list[float]:
    """Seconds of each open+read+close of the *n* small files in *d*, sorted."""
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        with open(d / f"s{i:05d}", "rb", buffering=0) as f:
            f.readinto(buf)
        lat.append(time.perf_counter() - t0)
    lat.sort()
    return lat


def idle_latency(d: Path, n: int, idle: float = 1.5) -> float:
    """p50 µs of open+read+close of the *n* small files of :func:`small_latency`, each
    name last used over a second ago (an engine reading a prefix's blocks again for a
    later request): the kernel's 1 s caches of names have lapsed, its 30 s ones not."""
    buf = bytearray(4096)
    time.sleep(idle)  # the point of the row: every name idle longer than the 1 s caches
    lat = _timed_reads(d, n, buf)
    return lat[len(lat) // 2] * 1e6


def stat_rate(d: Path, n: int, seconds: float = 1.0) -> float:
    names = [d / f"s{i:05d}" for i in range(n)]
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for p in names:
            os.stat(p)
        count += len(names)
    return count / (time.perf_counter() - t0)


def miss_rate(d: Path, n: int, seconds: float = 1.0) -> float:
    """stat() of *n* missing names, over and over (each miss asked again and again)."""
    names = [d / f"missing{i:05d}" for i in range(n)]
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for p in names:
            try:
                os.stat(p)
            except FileNotFoundError:
                pass
            else:  # pragma: no cover - the benchmark's own mistake
                raise AssertionError(f"{p} exists")
        count += len(names)
    return count / (time.perf_counter() - t0)


def listing(d: Path, n: int) -> tuple[float, float]:
    """(seconds to create, seconds to list) *n* empty entries in one directory."""
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(n):
        os.close(os.open(d / f"e{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    made = time.perf_counter() - t0
    t0 = time.perf_counter()
    with os.scandir(d) as it:
        got = sum(1 for _ in it)
    listed = time.perf_counter() - t0
    assert got == n, (got, n)
    return made, listed


def run_suite(root: Path, blocks: int, entries: int, payloads: list[bytes]) -> dict[str, Any]:
    buf = bytearray(BLOCK)
    out = {}
    writes, colds, repeats = [], [], []
    for r in range(2):
        d = root / f"seq{r}"
        writes.append(write_blocks(d, blocks, payloads))
        colds.append(read_blocks(d, blocks, buf))
        repeats.append(max(read_blocks(d, blocks, buf) for _ in range(2)))
        if r == 0:
            shutil.rmtree(d)
    out["write_GBps"] = max(writes)
    out["read_cold_GBps"] = max(colds)
    out["read_repeat_GBps"] = max(repeats)
    p50, p99 = small_latency(root / "small", 1000)
    out["open_read_close_p50_us"] = p50
    out["open_read_close_p99_us"] = p99
    out["open_read_close_idle_p50_us"] = idle_latency(root / "small", 1000)
    out["stat_per_s"] = stat_rate(root / "small", 1000)
    out["miss_per_s"] = miss_rate(root / "small", 1000)
    made, listed = listing(root / "list", entries)
    out["create_entries_per_s"] = entries / made
    out["list_entries_s"] = listed
    return out


# -- mounting ---------------------------------------------------------------------------


def _rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def mount_ceiling(mp: Path, transport: str = "pyfuse3") -> subprocess.Popen[bytes]:
    """The ceiling filesystem (:mod:`kvfs.mount.ceiling`) mounted at *mp* in a subprocess,
    on *transport* (pyfuse3, or kvfs's kernel transport)."""
    from kvfs.mount.ceiling import FSTYPE
    from kvfs.mount.daemon import mount_type

    mp.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvfs.mount.ceiling", str(mp), "--transport", transport], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 30
    while mount_type(mp) != FSTYPE:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise SystemExit(f"kvfs: bench fuse: the ceiling filesystem did not mount at {mp}: {err}")
        time.sleep(0.02)
    return proc


def umount_ceiling(mp: Path, proc: subprocess.Popen[bytes]) -> None:
    subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True, check=False)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True, check=False)


def run(args: argparse.Namespace) -> int:
    from kvfs.mount.daemon import mount_type  # noqa: F401  (fails early without the mount extra)

    blocks = args.blocks or (48 if args.quick else 128)
    entries = args.entries or (10_000 if args.quick else 100_000)
    payloads = _payloads(blocks)
    # DRAM holds two passes of blocks, the small files and the listing
    dram = (2 * blocks * BLOCK + 2 * 1000 * 4096 + entries * 4096 + 64 * MiB + MiB - 1) // MiB * MiB
    base = Path(tempfile.mkdtemp(prefix="kvfs-bench-fuse-", dir=args.dir))
    shm = Path(tempfile.mkdtemp(prefix="kvfs-bench-tmpfs-", dir="/dev/shm"))
    result: dict[str, Any] = {
        "blocks": blocks,
        "block_bytes": BLOCK,
        "entries": entries,
        "load": os.getloadavg()[0],
        "transport": args.transport,
        "lean": args.lean,
        "ceiling_transport": args.ceiling_transport,
    }
    try:
        # the DRAM tier as deployed (prefaulted and locked: its defaults), unless --lean: an
        # arena whose pages are faulted in by the seals themselves costs ~8x per copy
        cfg = dram_disk_config(base, dram, 4 * dram, lean=args.lean, extra=f'[mount]\ntransport = "{args.transport}"\n')
        mp = base / "mnt"
        _progress(args, "tmpfs")
        tmpfs = run_suite(shm, blocks, entries, payloads)
        shutil.rmtree(shm, ignore_errors=True)
        _progress(args, f"ceiling (a minimal filesystem on {args.ceiling_transport})")
        cmp = base / "ceiling"
        proc = mount_ceiling(cmp, args.ceiling_transport)
        try:
            ceiling = run_suite(cmp, blocks, entries, payloads)
        finally:
            umount_ceiling(cmp, proc)
        _progress(args, "kvfs")
        pid = mount(mp, cfg)
        try:
            kvfs = run_suite(mp, blocks, entries, payloads)
            _progress(args, "kvfs: first reads of blocks only on the disk tier, and the same files directly")
            first, again, direct = disk_first_reads(mp, base / "disk", blocks, payloads)
            result["disk_first"] = {
                "kvfs_GBps": first,
                "kvfs_again_GBps": again,
                "direct_GBps": direct,
                "ratio": first / direct,
                "ratio_again": again / direct,
            }
            if args.rss_rounds:
                _progress(args, f"kvfs daemon memory over {args.rss_rounds} rounds")
                result["rss"] = _rss_run(mp, pid, blocks, args.rss_rounds, payloads)
        finally:
            umount(mp)
        result["tmpfs"] = tmpfs
        result["ceiling"] = ceiling
        result["kvfs"] = kvfs
        result["ratio"] = {k: kvfs[k] / tmpfs[k] if tmpfs[k] else None for k in kvfs}
        result["ratio_ceiling"] = {k: kvfs[k] / ceiling[k] if ceiling[k] else None for k in kvfs}
        if args.settings:
            result["settings"] = {}
            for label, opts in VARIANTS.items():
                _progress(args, f"kvfs with {label}")
                shutil.rmtree(base / "disk", ignore_errors=True)
                mount(mp, cfg, opts)
                try:
                    buf = bytearray(BLOCK)
                    w = write_blocks(mp / "v", blocks, payloads)
                    c = read_blocks(mp / "v", blocks, buf)
                    rep = max(read_blocks(mp / "v", blocks, buf) for _ in range(2))
                finally:
                    umount(mp)
                result["settings"][label] = {"write_GBps": w, "read_cold_GBps": c, "read_repeat_GBps": rep}
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


def _progress(args: argparse.Namespace, what: str) -> None:
    if not args.json:
        print(f"  measuring {what}…", file=sys.stderr, flush=True)


def _rss_run(mp: Path, pid: int, blocks: int, rounds: int, payloads: list[bytes]) -> dict[str, Any]:
    buf = bytearray(BLOCK)
    d = mp / "rss"
    write_blocks(d, blocks, payloads)
    read_blocks(d, blocks, buf)
    shutil.rmtree(d)
    before = _rss_anon(pid)
    samples = []
    for _ in range(rounds):
        write_blocks(d, blocks, payloads)
        read_blocks(d, blocks, buf)
        read_blocks(d, blocks, buf)
        shutil.rmtree(d)
        samples.append(_rss_anon(pid))
    return {
        "rounds": rounds,
        "bytes_per_round": blocks * BLOCK,
        "rss_anon_before": before,
        "rss_anon_after": samples[-1],
        "rss_anon_max": max(samples),
        "rss_anon_median": statistics.median(samples),
    }


_LABELS = {
    "write_GBps": ("sequential write, 2 MiB blocks", "GB/s"),
    "read_cold_GBps": ("read, first after write", "GB/s"),
    "read_repeat_GBps": ("read, repeated", "GB/s"),
    "open_read_close_p50_us": ("open+read+close 4 KiB, p50", "us"),
    "open_read_close_p99_us": ("open+read+close 4 KiB, p99", "us"),
    "open_read_close_idle_p50_us": ("the same, names idle 1.5 s, p50", "us"),
    "stat_per_s": ("stat", "/s"),
    "miss_per_s": ("stat of a missing name", "/s"),
    "create_entries_per_s": ("create empty entries", "/s"),
    "list_entries_s": ("list the directory", "s"),
}


def _print(r: dict[str, Any]) -> None:
    print(
        f"kvfs bench fuse: {r['blocks']} blocks of {r['block_bytes'] // MiB} MiB, listing {r['entries']} entries "
        f"(load average {r['load']:.2f})"
    )
    print(f"{'':36} {'kvfs':>10} {'ceiling':>10} {'tmpfs':>10} {'/ceiling':>9} {'/tmpfs':>8}")
    for k, (label, unit) in _LABELS.items():
        a, c, b = r["kvfs"][k], r["ceiling"][k], r["tmpfs"][k]
        fmt = "{:>10.2f}" if unit in ("GB/s", "s") else "{:>10,.0f}"
        print(
            f"{label + ' (' + unit + ')':36} {fmt.format(a)} {fmt.format(c)} {fmt.format(b)} "
            f"{r['ratio_ceiling'][k]:>8.2f}x {r['ratio'][k]:>7.2f}x"
        )
    if "disk_first" in r:
        d = r["disk_first"]
        print(
            f"\nblocks only on the disk tier, read through the mount: first {d['kvfs_GBps']:.2f} GB/s, "
            f"again {d['kvfs_again_GBps']:.2f} GB/s; the same files read directly {d['direct_GBps']:.2f} GB/s: "
            f"{d['ratio']:.2f}x, {d['ratio_again']:.2f}x"
        )
    print(f"kvfs transport: {r['transport']}; ceiling transport: {r['ceiling_transport']}")
    if "settings" in r:
        print("\nper-file FUSE settings (kvfs only)")
        print(f"{'':36} {'write':>8} {'cold rd':>8} {'rep. rd':>8}  GB/s")
        for label, v in r["settings"].items():
            print(f"{label:36} {v['write_GBps']:>8.2f} {v['read_cold_GBps']:>8.2f} {v['read_repeat_GBps']:>8.2f}")
    if "rss" in r:
        s = r["rss"]
        print(
            f"\ndaemon private memory (RssAnon) over {s['rounds']} passes of {s['bytes_per_round'] / 1e9:.2f} GB: "
            f"before {s['rss_anon_before'] / MiB:.1f} MiB, after {s['rss_anon_after'] / MiB:.1f} MiB, "
            f"max {s['rss_anon_max'] / MiB:.1f} MiB"
        )
