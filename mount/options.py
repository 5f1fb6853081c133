"""Per-file FUSE settings of a kvfs mount (``$KVFS_FUSE_OPTIONS`` overrides them; the
choices and their measurements are in docs/benchmarks-fuse.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["FsOptions"]


@dataclass(frozen=True, kw_only=True)
class FsOptions:
    """``keep_cache``: sealed blocks are immutable and every version has its own inode, so
    the kernel may keep their pages across opens. ``direct_io_read``/``direct_io_write``:
    bypass the page cache (breaks mmap of sealed blocks; never used for them by default).
    ``attr_timeout``: seconds the kernel may cache a sealed block's attributes (they never
    change: a new version is a new inode). ``entry_timeout``: seconds it may cache a name
    (misses too: for at most the store's negative TTL when shared tiers may add names),
    and the attributes of directories and of files being written; of sealed blocks' names
    too when a tier is shared (else ``sealed_entry_timeout``). ``release_wait``: how long an operation on a name waits for the
    release that follows a close of that file (close-to-open; docs/SEMANTICS.md).
    """

    keep_cache: bool = True
    direct_io_read: bool = False
    direct_io_write: bool = False
    attr_timeout: float = 30.0
    entry_timeout: float = 1.0
    sealed_entry_timeout: float = 30.0
    """Seconds the kernel may cache the name of a sealed block when no tier is shared: a
    name changes only through this daemon then, and the daemon makes the kernel forget
    the names its store removes, replaces or renames (``KvfsOperations.names_changed``,
    from the store's events, drained at least once a second). With shared tiers another
    node may change a name behind the daemon's back: ``entry_timeout`` then."""
    release_wait: float = 1.0
    read_ahead_kb: int = 2048
    """Set on the mount's backing device (sysfs; needs root): the kernel's default of
    128 KiB splits a page-cache miss into 128 KiB requests; 2 MiB lets them reach the
    1 MiB FUSE maximum (2.3x faster uncached reads, docs/benchmarks-fuse.md). 0: leave."""
    noflush: bool = True
    """Read-only opens are answered ``FOPEN_NOFLUSH`` (kernel transport): closing them
    sends no FLUSH (there is nothing to report at their close)."""
    passthrough: bool = True
    """Blocks whose hottest copy is a disk file of the payload alone are read by the
    kernel from that file (kernel transport, with ``CAP_SYS_ADMIN``)."""
    max_inodes: int = 65536
    """Inodes the daemon keeps for the kernel at most (about 350 bytes each): past it the
    kernel is asked to forget the names of the longest idle files (no handle open), and
    looks them up again when they are used. The kernel's own cache of names could
    otherwise grow the daemon's table without bound (one inode per name ever looked up)."""
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
