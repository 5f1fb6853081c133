"""Exclusive ownership of a tier's arena or directory by one daemon.

Two daemons on one DRAM arena would serve each other's bytes under their own names; two
on one disk directory would clean, evict and overwrite each other's block files. So each
local tier takes an exclusive ``flock`` on its arena file or on a ``lock`` file in its
directory for as long as it is open, and a second daemon is refused with a message naming
the holder (its pid and command line, found in ``/proc/locks``). ``flock`` locks end with
the process, so a daemon that died leaves nothing to clean up by hand.
"""

from __future__ import annotations

import errno
import fcntl
import os

from .errors import TierInUse

__all__ = ["describe_holder", "lock_exclusive", "locked_by_someone"]


def lock_exclusive(fd: int, path: str, what: str) -> None:
    """Take the exclusive lock on the open file *fd* (at *path*) for the tier *what*, or
    raise :class:`TierInUse` naming whoever holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise TierInUse(
            f"{what}: {path} is in use by {describe_holder(fd)}; give each kvfs mount its own "
            "path (or unmount the other one first)"
        ) from None


def locked_by_someone(fd: int) -> bool:
    """True when another open file holds a lock on *fd*'s file (probes with a shared lock)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def describe_holder(fd: int) -> str:
    """``pid N (its command line)`` of the process holding a flock on *fd*'s file, from
    /proc/locks; ``another process`` when it cannot be found."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return "another process"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF" (blocked waiters start with "->")
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            pid = fields[4]
            return f"pid {pid} ({_command(pid)})"
    return "another process"


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "a process this user cannot see"
    if "kvfs.mount.daemon" in argv and argv:
        return f"the kvfs daemon of {argv[-1]}"
    text = " ".join(argv)
    return text if len(text) <= 160 else text[:157] + "..."
