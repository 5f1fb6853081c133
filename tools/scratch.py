"""Throwaway kvfs mounts and a local S3 endpoint for the benchmarks.

``kvfs bench fuse`` and ``kvfs bench ttft`` mount kvfs themselves, with a config of
their own, in a temporary directory; ``kvfs bench s3`` and ``bench ttft`` start moto's S3
server on 127.0.0.1 when no endpoint is given. Everything here is undone on exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "dram_disk_config",
    "drop_page_cache_under",
    "end_on_sigterm",
    "mount",
    "progress",
    "start_moto",
    "umount",
]

_mounting = 0  # mounts in progress: a SIGTERM waits for them (see end_on_sigterm)
_term_pending = False


def end_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``, a CI job's cancel, a service manager's stop) end
    a bench or a stream (``kvfs events``, ``kvfs top``) as Ctrl-C does (``KeyboardInterrupt``):
    its ``finally`` blocks run, so the mounts a bench made are unmounted and their daemons
    end, and the ``events --zmq`` publisher says AllBlocksCleared and closes its socket.
    Python's default ends the process at once, which left a bench's mount daemon running;
    SIGINT alone cannot stop a stream from a script (a shell starts its background jobs with
    SIGINT ignored, and Python keeps it ignored). A SIGTERM that comes while :func:`mount` runs is held until the
    mount is made, then unmounts it and ends the bench (killing ``kvfs mount`` half-way
    would leave a daemon no one knows of). A second SIGTERM ends the process at once."""

    def stop(signum: int, frame: object) -> None:
        global _term_pending
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _mounting:
            _term_pending = True
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def progress(as_json: bool) -> Callable[..., None]:
    """Where a bench says what it is doing: stderr when stdout is its ``--json``."""
    if as_json:
        return lambda *a: print(*a, file=sys.stderr, flush=True)
    return lambda *a: print(*a, flush=True)


def dram_disk_config(
    base: Path, dram: int | str, disk: int | str, name: str = "bench.toml", *, lean: bool = True, extra: str = ""
) -> Path:
    """A config file under *base*: a DRAM tier of *dram* over a disk tier of *disk* in
    ``base/disk`` (sizes in bytes or like ``"64MiB"``). *lean*: no mlock, no prefault (the
    tier's defaults otherwise); *extra*: more TOML after the tiers (e.g. a ``[client]``)."""

    def size(v: int | str) -> str:
        return str(v) if isinstance(v, int) else f'"{v}"'

    tune = "mlock = false\nprefault = false\n" if lean else ""
    cfg = base / name
    cfg.write_text(
        f'[[tiers]]\nkind = "dram"\nname = "dram"\ncapacity = {size(dram)}\n{tune}\n'
        f'[[tiers]]\nkind = "disk"\nname = "disk"\ncapacity = {size(disk)}\npath = "{base}/disk"\n'
        + (f"\n{extra}" if extra else "")
    )
    return cfg


def mount(
    mp: Path, config: Path, fuse_options: dict[str, object] | None = None, env: dict[str, str] | None = None
) -> int:
    """``kvfs mount MP --config CONFIG`` (background daemon); returns the daemon's pid."""
    from kvfs.mount.paths import pid_path

    mp.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    if fuse_options:
        full_env["KVFS_FUSE_OPTIONS"] = json.dumps(fuse_options)
    global _mounting
    _mounting += 1
    try:
        res = subprocess.run(
            [sys.executable, "-m", "kvfs.tools.cli", "mount", str(mp), "--config", str(config)],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=120,
            check=False,
        )
    finally:
        _mounting -= 1
    if _term_pending and not _mounting:  # a SIGTERM came meanwhile: undo the mount, then end
        umount(mp)
        raise KeyboardInterrupt
    if res.returncode != 0:
        raise SystemExit(f"kvfs: bench: mount of {mp} failed: {res.stderr.strip()}")
    return int(pid_path(mp).read_text())


def umount(mp: Path) -> None:
    """``kvfs umount MP``, then a lazy ``fusermount3 -u -z`` if anything is left."""
    from kvfs.mount.daemon import mount_type

    subprocess.run(
        [sys.executable, "-m", "kvfs.tools.cli", "umount", str(mp)], capture_output=True, timeout=600, check=False
    )
    if mount_type(mp) is not None:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server in a subprocess on 127.0.0.1; returns ``(process, endpoint url)``."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start within 30 s (is moto[server] installed?)")


def drop_page_cache_under(root: Path) -> int:
    """Ask the kernel to drop the cached pages of every file under *root* (e.g. a disk
    tier's block files, so a read really comes from the device); returns the file count."""
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            try:
                fd = os.open(os.path.join(dirpath, fn), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n
