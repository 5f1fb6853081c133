"""The runtime directory: where a mount's daemon can be reached, and which mount a path is in.

In the core so that :mod:`kvfs.client` finds a daemon from a mountpoint without the
mount package; :mod:`kvfs.mount.paths` re-exports it for the daemon and the tools.

The control socket of the mount at MOUNTPOINT lives at
``<runtime dir>/<first 16 hex of sha256(realpath(MOUNTPOINT))>.sock`` where the runtime
dir is ``$XDG_RUNTIME_DIR/kvfs`` or ``/tmp/kvfs-<uid>``. The daemon's log, pid file and
unmount report sit beside it with ``.log``/``.pid``/``.umount``.
kvfs mounts show in /proc/self/mountinfo with filesystem type ``fuse.kvfs``.

The runtime directory is trusted only if it is safe: created ``0700``, and refused
(:class:`RuntimeDirError`) unless it is a real directory (not a symlink) owned by this
user and closed to everyone else. ``/tmp`` is shared by every local user: one who
pre-created ``/tmp/kvfs-<uid>`` could otherwise redirect the daemon's pid file and log
through symlinks, or put a fake control socket in front of the tools. Files in it are
opened with ``O_NOFOLLOW`` (:func:`open_private`), so a symlink is never followed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from kvfs.errors import RuntimeDirError

__all__ = [
    "FSTYPE",
    "control_socket_path",
    "find_mount",
    "kvfs_mounts",
    "log_path",
    "mount_key",
    "open_private",
    "pid_path",
    "read_private",
    "real_path",
    "runtime_dir",
    "umount_report_path",
    "unescape",
    "write_private",
]

FSTYPE = "fuse.kvfs"


def runtime_dir() -> Path:
    """The runtime directory, created ``0700`` if missing; :class:`RuntimeDirError` if it
    exists and is not a directory that only this user can use."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "kvfs" if base else Path(f"/tmp/kvfs-{os.getuid()}")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RuntimeDirError(f"cannot create the runtime directory {d}: {exc.strerror}") from exc
    st = os.lstat(d)
    uid = os.getuid()
    fix = f"remove it (rm -rf {d}) or set XDG_RUNTIME_DIR to a directory of your own"
    if stat.S_ISLNK(st.st_mode):
        raise RuntimeDirError(f"the runtime directory {d} is a symlink; kvfs will not follow it: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"the runtime directory {d} is not a directory: {fix}")
    if st.st_uid != uid:
        raise RuntimeDirError(
            f"the runtime directory {d} belongs to uid {st.st_uid}, not to you (uid {uid}): another user "
            f"may have made it to intercept kvfs's pid file, log and control socket; {fix}"
        )
    if st.st_mode & 0o077:
        raise RuntimeDirError(
            f"the runtime directory {d} is open to other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"what is in it cannot be trusted: {fix}"
        )
    return d


def open_private(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """``os.open`` of a file in the runtime directory that never follows a symlink."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink where our file should be
            raise RuntimeDirError(f"{path} is a symlink; kvfs will not follow it: remove it") from exc
        raise


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Replace the contents of *path* (created ``0600``, never through a symlink)."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def read_private(path: str | os.PathLike[str]) -> str | None:
    """The contents of *path*, or None if it does not exist (never through a symlink)."""
    try:
        fd = open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        return f.read()


def mount_key(mountpoint: str | os.PathLike[str]) -> str:
    return hashlib.sha256(os.path.realpath(mountpoint).encode()).hexdigest()[:16]


def control_socket_path(mountpoint: str | os.PathLike[str]) -> Path:
    return runtime_dir() / f"{mount_key(mountpoint)}.sock"


def log_path(mountpoint: str | os.PathLike[str]) -> Path:
    return runtime_dir() / f"{mount_key(mountpoint)}.log"


def pid_path(mountpoint: str | os.PathLike[str]) -> Path:
    return runtime_dir() / f"{mount_key(mountpoint)}.pid"


def umount_report_path(mountpoint: str | os.PathLike[str]) -> Path:
    """Where the daemon leaves what its last unmount could not write down (JSON)."""
    return runtime_dir() / f"{mount_key(mountpoint)}.umount"


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


def real_path(path: str | os.PathLike[str]) -> str:
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


def find_mount(path: str | os.PathLike[str]) -> tuple[str, str] | None:
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
