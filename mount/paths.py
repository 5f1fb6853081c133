"""Where a mount's daemon can be reached, and which mount a path is in.

The control socket of the mount at MOUNTPOINT lives at
``<runtime dir>/<first 16 hex of sha256(realpath(MOUNTPOINT))>.sock`` where the runtime
dir is ``$XDG_RUNTIME_DIR/kvfs`` or ``/tmp/kvfs-<uid>`` (created 0700: the socket is
owner-only). The daemon's log and pid file sit beside it with ``.log``/``.pid``.
kvfs mounts show in /proc/self/mountinfo with filesystem type ``fuse.kvfs``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "FSTYPE",
    "control_socket_path",
    "find_mount",
    "kvfs_mounts",
    "log_path",
    "pid_path",
    "real_path",
    "runtime_dir",
    "unescape",
]

FSTYPE = "fuse.kvfs"


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "kvfs" if base else Path(f"/tmp/kvfs-{os.getuid()}")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def _key(mountpoint: str | os.PathLike) -> str:
    return hashlib.sha256(os.path.realpath(mountpoint).encode()).hexdigest()[:16]


def control_socket_path(mountpoint: str | os.PathLike) -> Path:
    return runtime_dir() / f"{_key(mountpoint)}.sock"


def log_path(mountpoint: str | os.PathLike) -> Path:
    return runtime_dir() / f"{_key(mountpoint)}.log"


def pid_path(mountpoint: str | os.PathLike) -> Path:
    return runtime_dir() / f"{_key(mountpoint)}.pid"


def unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def real_path(path: str | os.PathLike) -> str:
    """realpath without stat()ing the last component (it may be a hung FUSE mount)."""
    p = os.path.abspath(path)
    head, tail = os.path.split(p)
    return os.path.join(os.path.realpath(head), tail) if tail else os.path.realpath(p)


def kvfs_mounts() -> list[str]:
    """Mountpoints of every kvfs filesystem visible to this process."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype = right.split(" ", 1)[0]
                if fstype == FSTYPE:
                    found.append(unescape(left.split(" ")[4]))
    except OSError:
        pass
    return found


def find_mount(path: str | os.PathLike) -> tuple[str, str] | None:
    """``(mountpoint, name inside the mount)`` for *path*, or None if it is in no kvfs mount.

    Works without touching the filesystem at *path* (a stale mount does not hang it).
    """
    real = os.path.realpath(os.path.abspath(path))
    best = None
    for mp in kvfs_mounts():
        inside = real == mp or real.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) > len(best)):
            best = mp
    if best is None:
        return None
    rel = real[len(best) :].strip("/")
    return best, rel
