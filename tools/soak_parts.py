"""The parts of ``kvfs bench soak`` beyond the FUSE load (tools/bench_soak.py): batch-client
load with every byte checked, the daemon's RSS and descriptors sampled, KV events
counted, and one fault at a time on a schedule.

Faults, in turn, one per ``--fault-every`` seconds:

- ``kill-client``: a client process holding leases, views and reservations is SIGKILLed;
  what it held must come back (it is checked once the faults are over: nothing left held
  but what live clients hold);
- ``stall-posix``: the shared posix tier (a stallfs mount, tools/stallfs.py) stops
  answering for ``--stall`` seconds;
- ``corrupt-disk``: a byte of a block file in the disk tier is flipped (reads must never
  return it: the copy fails its checksum and is dropped);
- ``flood``: hundreds of connections opened to the daemon's socket at once and held for a
  while (past its connection limits: refused, never a tier made unhealthy).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvfs.client import BatchError

__all__ = ["ClientLoad", "EventCounter", "Faults", "Sampler", "slope"]

MiB = 1 << 20
FAULTS = ("kill-client", "stall-posix", "corrupt-disk", "flood")

_HOLDER = r"""
import sys, time
from kvfs.client import Client
mp, ns = sys.argv[1], sys.argv[2]
c = Client(mp, write=True)
names = [f"{ns}/victim/{i}" for i in range(8)]
c.put(names, [bytes([i]) * 65536 for i in range(8)])
views = c.get(names)
puts = c.reserve([f"{ns}/victim/r{i}" for i in range(4)], [65536] * 4)
print("holding", flush=True)
time.sleep(3600)
"""


def rss_fds(pid: int) -> tuple[int, int]:
    """RSS (bytes) and open descriptors of process *pid*."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of *points* ``(x, y)`` (0 with fewer than two)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in points) / var


@dataclass
class Sampler:
    """The daemon's RSS and descriptors every *every* seconds: ``(seconds, rss, fds)``."""

    pid: int
    every: float = 10.0
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def run(self, t0: float, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                rss, fds = rss_fds(self.pid)
            except OSError:
                return  # the daemon is gone: the report says so
            self.samples.append((time.monotonic() - t0, rss, fds))
            stop.wait(self.every)

    def after(self, warmup: float) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if s[0] >= warmup]


class ClientLoad:
    """Batch-client workers putting and reading versions of their own names in namespace
    *ns*, checking every byte read (*check*: tools/bench_soak.check_version)."""

    def __init__(self, mp: Path, ns: str, make: Any, check: Any) -> None:
        self.mp = mp
        self.ns = ns
        self.make = make
        self.check = check
        self.lock = threading.Lock()
        self.puts = 0
        self.reads = 0
        self.bytes_read = 0
        self.misses = 0
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.sessions_cut = 0
        self._version = 0

    def worker(self, seed: int, stop: threading.Event) -> None:
        from kvfs.client import BatchError, Client
        from kvfs.errors import KvfsError

        rng = random.Random(seed)
        hashes = [f"{seed:02x}{i:030x}" for i in range(48)]  # hash-shaped: published as KV events
        names = [f"{self.ns}/{h[:2]}/{h}" for h in hashes]
        while not stop.is_set():
            try:
                with Client(self.mp, write=True, name=f"soak {seed}") as c:
                    for _ in range(200):
                        if stop.is_set():
                            return
                        self._round(c, rng, names, BatchError)
            except KvfsError as exc:  # a session cut or refused (a flood, a limit): a fresh one, soon
                with self.lock:
                    self.sessions_cut += 1
                    if len(self.errors) < 20:
                        self.errors.append(f"client session: {exc}")
                stop.wait(0.2)

    def _round(self, c: Any, rng: random.Random, names: list[str], batch_error: type[BatchError]) -> None:
        batch = rng.sample(names, 6)
        with self.lock:
            self._version += 1
            v = self._version
        data = [self.make(n, v, rng.choice([4096, 65536, 300_001])) for n in batch]
        try:
            c.put(batch, data)
            with self.lock:
                self.puts += len(batch)
        except batch_error:
            pass  # room for some only (a namespace at its quota): read what is there
        bufs = [bytearray(300_001) for _ in batch]
        try:
            sizes = c.get_into(batch, bufs, verify=rng.random() < 0.5)
        except batch_error as exc:
            sizes = [r if isinstance(r, int) else None for r in exc.results]
        for n, b, size in zip(batch, bufs, sizes, strict=True):
            if size is None:
                with self.lock:
                    self.misses += 1
                continue
            why = self.check(n, bytes(b[:size]))
            with self.lock:
                self.reads += 1
                self.bytes_read += size
                if why is not None:
                    self.wrong.append(f"client {n}: {why}")
        if rng.random() < 0.2:
            c.lookup(names)


class EventCounter:
    """A ZMQ subscriber on the daemon's KV events: messages, events and resyncs
    (``AllBlocksCleared``) received."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.messages = 0
        self.events = 0
        self.resyncs = 0
        self.gaps = 0

    def run(self, stop: threading.Event) -> None:
        import msgpack
        import zmq

        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.addr)
        last = None
        try:
            while not stop.is_set():
                if not sock.poll(200):
                    continue
                _topic, seq, payload = sock.recv_multipart()
                n = int.from_bytes(seq, "big")
                if last is not None and n != last + 1:
                    self.gaps += 1
                last = n
                _ts, batch = msgpack.unpackb(payload, raw=False)
                self.messages += 1
                self.events += len(batch)
                self.resyncs += sum(1 for e in batch if e.get("type") == "AllBlocksCleared")
        finally:
            sock.close(linger=0)


class Faults:
    """One fault per *every* seconds, in turn (see the module doc); ``log`` says what was
    done, with when."""

    def __init__(self, mp: Path, ns: str, disk: Path, stall: Any, *, every: float, stall_for: float) -> None:
        self.mp = mp
        self.ns = ns
        self.disk = disk
        self.stall = stall
        self.every = every
        self.stall_for = stall_for
        self.log: list[str] = []
        self.flood_refused = 0

    def run(self, t0: float, stop: threading.Event) -> None:
        i = 0
        while not stop.wait(self.every):
            kind = FAULTS[i % len(FAULTS)]
            i += 1
            try:
                what = getattr(self, kind.replace("-", "_"))(stop)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be made is reported, not fatal
                what = f"could not: {type(exc).__name__}: {exc}"
            self.log.append(f"{time.monotonic() - t0:6.0f} s  {kind}: {what}")

    def kill_client(self, stop: threading.Event) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(self.mp), self.ns],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        return "a client holding 8 views and 4 reservations killed" if line == "holding" else f"holder said {line!r}"

    def stall_posix(self, stop: threading.Event) -> str:
        if self.stall is None:
            return "no posix tier"
        self.stall.stall()
        stop.wait(self.stall_for)
        self.stall.resume()
        return f"posix tier stalled for {self.stall_for:.0f} s"

    def corrupt_disk(self, stop: threading.Event) -> str:
        files = [p for p in (self.disk / "blocks").rglob("*") if p.is_file() and not p.name.startswith(".")]
        if not files:
            return "no block file on disk"
        victim = random.choice(files)
        size = victim.stat().st_size
        if size <= 4096:
            return f"{victim.name}: too small"
        with open(victim, "r+b") as f:
            at = random.randrange(4096, size)
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))
        return f"flipped byte {at} of {victim.relative_to(self.disk)}"

    def flood(self, stop: threading.Event) -> str:
        from kvfs.mount.paths import control_socket_path

        held = []
        try:
            for _ in range(600):
                s = socket.socket(socket.AF_UNIX)
                s.setblocking(False)
                try:
                    s.connect(str(control_socket_path(self.mp)))
                except OSError:
                    s.close()
                    continue
                held.append(s)
            stop.wait(10)
            refused = 0
            for s in held:
                try:
                    s.setblocking(True)
                    s.settimeout(0.5)
                    if b"LimitReached" in s.recv(4096):
                        refused += 1
                except OSError:
                    pass
            self.flood_refused += refused
            return f"{len(held)} connections held 10 s, {refused} refused with LimitReached"
        finally:
            for s in held:
                s.close()
