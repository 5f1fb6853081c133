"""A kvfs mount whose shared tier can be made to stop answering, for ``kvfs bench faults``
and tests/tiers/test_faults.py.

:class:`FaultRig` mounts kvfs (a real daemon) over DRAM, a disk tier and one shared tier,
and breaks the shared tier in one of three ways, each a real fault:

- ``posix-stall``: the posix tier's directory is on a passthrough FUSE filesystem that
  stops answering (:mod:`kvfs.tools.stallfs`), as a hard NFS mount does when its server
  is gone: every call on it blocks in the kernel;
- ``s3-stopped``: the S3 tier is a moto server in its own process, stopped with SIGSTOP:
  connections are accepted by the kernel and never answered;
- ``s3-blackhole``: the S3 tier's endpoint is a TCP listener in front of moto that, when
  broken, holds every connection (old and new) open and never answers.

It writes blocks through the mount the way engines do (temporary name, ``os.replace``),
waits until the shared tier holds them, and leaves some in DRAM, some only on disk (plus
the shared tier) and one only in the shared tier; then it times hits, the shared-only
block's failure, ``kvfs umount`` and the recovery. Everything is undone by :meth:`close`.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .scratch import mount as scratch_mount
from .scratch import start_moto
from .scratch import umount as scratch_umount

__all__ = ["SCENARIOS", "Blackhole", "FaultRig", "Latency"]

SCENARIOS = ("posix-stall", "s3-stopped", "s3-blackhole")

_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True, slots=True)
class Latency:
    """Latencies of one kind of access, in seconds."""

    samples: tuple[float, ...]

    def pct(self, q: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")

    @property
    def p50(self) -> float:
        return self.pct(0.50)

    @property
    def p99(self) -> float:
        return self.pct(0.99)

    @property
    def max(self) -> float:
        return max(self.samples) if self.samples else float("nan")

    def to_json(self) -> dict[str, float | int]:
        return {"n": len(self.samples), "p50_ms": self.p50 * 1e3, "p99_ms": self.p99 * 1e3, "max_ms": self.max * 1e3}


class Blackhole:
    """A TCP endpoint on 127.0.0.1 in front of *upstream* (``host:port``): it forwards
    until :meth:`break_` is called; from then on every connection, old and new, is held
    open and never answered; :meth:`mend` drops the held ones and forwards again."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._broken = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="blackhole").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(client)
            if not self._broken.is_set():
                threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._conns.append(upstream)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.05)
        while not self._closed:
            if self._broken.is_set():
                time.sleep(0.05)  # hold the connection: read nothing, answer nothing
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def break_(self) -> None:
        self._broken.set()

    def mend(self) -> None:
        with self._lock:
            held, self._conns = self._conns, []
        for s in held:
            try:
                s.close()
            except OSError:
                pass
        self._broken.clear()

    def close(self) -> None:
        self._closed = True
        self.mend()
        self._listener.close()


class FaultRig:
    """kvfs over dram (*hot* blocks) + disk + the shared tier of *scenario* (see the
    module doc), with *timeout* seconds as the shared tier's timeout. *blocks* blocks of
    *block_size* bytes are written by :meth:`populate`."""

    def __init__(
        self,
        scenario: str,
        *,
        root: Path | None = None,
        blocks: int = 12,
        hot: int = 4,
        block_size: int = 256 << 10,
        timeout: float = 2.0,
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
        self.scenario = scenario
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="kvfs-faults-", dir="/var/tmp"))
        self.blocks = blocks
        self.hot = hot
        self.block_size = block_size
        self.timeout = timeout
        self.mp = self.root / "mnt"
        self.env = dict(_FAKE_CREDENTIALS)
        self._stall: Any = None
        self._moto: subprocess.Popen[bytes] | None = None
        self._hole: Blackhole | None = None
        self._stopped = False
        self.names: list[str] = []
        self.data: dict[str, bytes] = {}
        self.shared_only = ""
        self.mounted = False
        try:
            self._start_backend()
            self.config = self.root / "kvfs.toml"
            self.config.write_text(self._config_text())
        except BaseException:
            self.close()
            raise

    # -- the shared tier and its fault -------------------------------------------------

    def _start_backend(self) -> None:
        if self.scenario == "posix-stall":
            from .stallfs import StallingMount

            self._stall = StallingMount(self.root)
            return
        self._moto, endpoint = start_moto()
        self.endpoint = endpoint
        import boto3

        os.environ.update(self.env)
        boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="kvfs-faults"
        )
        if self.scenario == "s3-blackhole":
            port = int(endpoint.rsplit(":", 1)[1])
            self._hole = Blackhole(("127.0.0.1", port))
            self.endpoint = self._hole.endpoint_url

    @property
    def deadline(self) -> float:
        """Seconds a call to the shared tier may take before it fails (its deadline)."""
        return self.timeout if self.scenario == "posix-stall" else self.timeout * 2

    def _config_text(self) -> str:
        head = f"""
[policy]
eviction = "lru"
promote = "never"

[[tiers]]
kind = "dram"
capacity = {self.hot * self.block_size}
mlock = false
prefault = false

[[tiers]]
kind = "disk"
capacity = "1GiB"
path = "{self.root / "disk"}"
"""
        if self.scenario == "posix-stall":
            shared = f"""
[[tiers]]
kind = "posix"
capacity = "1GiB"
path = "{self._stall.mountpoint / "shared"}"
timeout = "{self.timeout}s"
"""
        else:
            shared = f"""
[[tiers]]
kind = "s3"
bucket = "kvfs-faults"
endpoint_url = "{self.endpoint}"
timeout = "{self.timeout}s"
max_attempts = 2
"""
        return head + shared + '\n[mount]\nnegative_ttl = "0.5s"\nlisting_ttl = "1s"\n'

    def break_(self) -> None:
        """Make the shared tier stop answering."""
        if self._stall is not None:
            self._stall.stall()
        elif self._hole is not None:
            self._hole.break_()
        elif self._moto is not None:
            self._moto.send_signal(signal.SIGSTOP)
            self._stopped = True

    def mend(self) -> None:
        """Make it answer again."""
        if self._stall is not None:
            self._stall.resume()
        elif self._hole is not None:
            self._hole.mend()
        elif self._moto is not None and self._stopped:
            self._moto.send_signal(signal.SIGCONT)
            self._stopped = False

    # -- the mount -----------------------------------------------------------------------

    def mount(self) -> None:
        scratch_mount(self.mp, self.config, env=self.env)
        self.mounted = True

    def umount(self) -> tuple[float, int, str]:
        """``kvfs umount`` now: ``(seconds, exit status, what it printed)``."""
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "kvfs.tools.cli", "umount", str(self.mp)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        took = time.perf_counter() - t0
        self.mounted = False
        return took, res.returncode, (res.stderr + res.stdout).strip()

    def tiers_of(self, name: str) -> list[str]:
        return os.getxattr(self.mp / name, "user.kvfs.tiers").decode().split(",")

    def publish(self, name: str, data: bytes) -> None:
        """Write a block the way engines do: a temporary name, then ``os.replace``."""
        path = self.mp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self.data[name] = data

    def populate(self) -> None:
        """Write the blocks; wait until the shared tier holds each; leave the last ones
        in DRAM, the others on disk, and one only in the shared tier."""
        rng = random.Random(11)
        self.names = [f"m/{i % 4:02x}/blk{i:03d}" for i in range(self.blocks)]
        for name in self.names:
            self.publish(name, rng.randbytes(self.block_size))
        shared = "posix" if self.scenario == "posix-stall" else "s3"
        deadline = time.monotonic() + 60
        for name in self.names:
            while shared not in self.tiers_of(name):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} never reached the {shared} tier")
                time.sleep(0.05)
        self.shared_only = self.names[0]
        res = subprocess.run(
            [sys.executable, "-m", "kvfs.tools.cli", "evict", str(self.mp / self.shared_only)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0 or self.tiers_of(self.shared_only) != [shared]:
            raise RuntimeError(f"could not leave {self.shared_only} in {shared} only: {res.stderr}")

    def local(self, tier: str) -> list[str]:
        """Blocks whose hottest copy is in *tier* (``dram`` or ``disk``)."""
        return [n for n in self.names[1:] if self.tiers_of(n)[0] == tier]

    # -- measurements ------------------------------------------------------------------

    def hits(self, names: list[str], n: int) -> Latency:
        """*n* reads (open, read, close) of *names* in turn, each checked byte-exact."""
        out = []
        for i in range(n):
            name = names[i % len(names)]
            t0 = time.perf_counter()
            with open(self.mp / name, "rb", buffering=0) as f:
                got = f.read()
            out.append(time.perf_counter() - t0)
            if got != self.data[name]:
                raise AssertionError(f"{name}: wrong bytes during the fault")
        return Latency(tuple(out))

    def read_shared_only(self) -> tuple[float, int | None]:
        """Read the block only the shared tier holds: ``(seconds, errno or None)``."""
        t0 = time.perf_counter()
        try:
            got = (self.mp / self.shared_only).read_bytes()
        except OSError as exc:
            return time.perf_counter() - t0, exc.errno
        if got != self.data[self.shared_only]:
            raise AssertionError(f"{self.shared_only}: wrong bytes")
        return time.perf_counter() - t0, None

    def load_shared(self, stop: threading.Event) -> threading.Thread:
        """A thread that keeps asking the shared tier (the shared-only block, names no
        node has) until *stop* is set, as engines probing for cached prefixes do."""

        def run() -> None:
            k = 0
            while not stop.is_set():
                k += 1
                try:
                    os.stat(self.mp / "m" / "00" / f"absent-{k}")
                except OSError:
                    pass
                try:
                    (self.mp / self.shared_only).read_bytes()
                except OSError:
                    pass

        t = threading.Thread(target=run, daemon=True, name="shared-load")
        t.start()
        return t

    def recovery(self, limit: float = 60.0) -> float:
        """Seconds from now until the shared-only block reads again (after :meth:`mend`)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit:
            _, err = self.read_shared_only()
            if err is None:
                return time.perf_counter() - t0
            time.sleep(0.1)
        raise RuntimeError(f"the shared tier did not recover within {limit:g}s")

    def intact(self) -> list[str]:
        """Names that do not read back byte-exact (empty: nothing lost or wrong)."""
        bad = []
        for name, data in self.data.items():
            try:
                if (self.mp / name).read_bytes() != data:
                    bad.append(name)
            except OSError as exc:
                bad.append(f"{name} ({errno.errorcode.get(exc.errno or 0, exc.errno)})")
        return bad

    def close(self) -> None:
        self.mend()
        if self.mounted:
            scratch_umount(self.mp)
            self.mounted = False
        if self._stall is not None:
            self._stall.close()
        if self._hole is not None:
            self._hole.close()
        if self._moto is not None:
            self._moto.kill()
            self._moto.wait(10)
