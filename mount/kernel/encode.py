"""Replies in the kernel's layouts: attributes, entries, open files, statfs, directories.

The filesystem's handlers answer with pyfuse3's reply objects (``EntryAttributes``,
``FileInfo``, ``StatvfsData``) or anything with the same attribute names; these
functions turn them into the structs of :mod:`.abi`. :class:`DirBuffer` is the token a
``readdir`` handler fills (``READDIRPLUS``: every entry with its attributes, each one a
lookup the kernel will forget). :class:`SetattrFields` says which fields a ``SETATTR``
sets, as pyfuse3's does.
"""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass
from typing import Any

from . import abi

__all__ = ["DirBuffer", "SetattrFields", "attr_out", "entry_out", "open_out", "statfs_out"]

_NS = 1_000_000_000


_SPLITS: dict[float, tuple[int, int]] = {}


def _split(seconds: float) -> tuple[int, int]:
    """A timeout in seconds as the kernel's (seconds, nanoseconds), never negative
    (remembered: a mount replies with a handful of distinct timeouts)."""
    out = _SPLITS.get(seconds)
    if out is None:
        if seconds <= 0:
            out = (0, 0)
        else:
            whole = int(seconds)
            out = (whole, int((seconds - whole) * _NS))
        if len(_SPLITS) < 64:
            _SPLITS[seconds] = out
    return out


def _attr(a: Any) -> tuple[int, ...]:
    at, mt, ct = a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns
    return (
        a.st_ino,
        a.st_size,
        a.st_blocks,
        at // _NS,
        mt // _NS,
        ct // _NS,
        at % _NS,
        mt % _NS,
        ct % _NS,
        a.st_mode,
        a.st_nlink,
        a.st_uid,
        a.st_gid,
        a.st_rdev,
        a.st_blksize,
        0,
    )


def entry_out(a: Any) -> bytes:
    """``fuse_entry_out`` of *a*; ``st_ino`` 0 is a miss the kernel caches for
    ``entry_timeout`` (its attributes are not sent)."""
    es, ens = _split(a.entry_timeout)
    if not a.st_ino:
        return abi.ENTRY_OUT.pack(0, 0, es, 0, ens, 0, *(0,) * 16)
    ats, atns = _split(a.attr_timeout)
    return abi.ENTRY_OUT.pack(a.st_ino, a.generation, es, ats, ens, atns, *_attr(a))


def attr_out(a: Any) -> bytes:
    """``fuse_attr_out`` of *a* (GETATTR and SETATTR)."""
    ats, atns = _split(a.attr_timeout)
    return abi.ATTR_OUT.pack(ats, atns, 0, *_attr(a))


def open_out(info: Any) -> bytes:
    """``fuse_open_out`` of a ``FileInfo`` (and the kvfs additions of
    :class:`kvfs.mount.transport.FileReply`: ``noflush``, ``backing_id``)."""
    flags = 0
    if info.direct_io:
        flags |= abi.Open.DIRECT_IO
    if info.keep_cache:
        flags |= abi.Open.KEEP_CACHE
    if info.nonseekable:
        flags |= abi.Open.NONSEEKABLE
    if getattr(info, "noflush", False):
        flags |= abi.Open.NOFLUSH
    backing = getattr(info, "backing_id", 0) or 0
    if backing:
        flags |= abi.Open.PASSTHROUGH
    return abi.OPEN_OUT.pack(info.fh, flags, backing)


def statfs_out(s: Any) -> bytes:
    """``fuse_kstatfs`` of a ``StatvfsData``."""
    return abi.STATFS_OUT.pack(
        s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize, s.f_namemax, s.f_frsize, 0
    )


@dataclass(slots=True)
class SetattrFields:
    """Which fields a SETATTR changes (pyfuse3's attribute names)."""

    update_atime: bool = False
    update_mtime: bool = False
    update_ctime: bool = False
    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False


@dataclass(slots=True)
class SetattrValues:
    """The new values of a SETATTR (pyfuse3's ``EntryAttributes`` names for the fields
    a SETATTR carries)."""

    st_mode: int = 0
    st_uid: int = 0
    st_gid: int = 0
    st_size: int = 0
    st_atime_ns: int = 0
    st_mtime_ns: int = 0
    st_ctime_ns: int = 0


# a READDIRPLUS entry's fixed part: fuse_entry_out, then fuse_dirent (its name follows)
_DIRENTPLUS = struct.Struct(abi.ENTRY_OUT.format + abi.DIRENT.format[1:])
_DIRENTPLUS_SIZE = _DIRENTPLUS.size
_FIRST_BUFFER = 64 << 10


class DirBuffer:
    """The READDIRPLUS reply being filled: entries until *size* bytes (the kernel's
    buffer). :meth:`add` is what a ``readdir`` handler calls for each entry; each is
    packed in place into one zeroed buffer (its padding stays zero), grown by doubling
    up to *size* (the kernel asks for up to 1 MiB, a small directory fills a page)."""

    __slots__ = ("_buf", "_pos", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._pos = 0
        self._buf = bytearray(min(size, _FIRST_BUFFER))

    def add(self, name: bytes, attr: Any, next_id: int) -> bool:
        """Add the entry *name* with *attr*s (whose reply counts one lookup) and the
        offset of the next entry; False, adding nothing, when it does not fit."""
        n = len(name)
        pos = self._pos
        end = pos + ((_DIRENTPLUS_SIZE + n + 7) & ~7)
        if end > len(self._buf):
            if end > self._size:
                return False
            self._buf.extend(bytes(min(max(len(self._buf), end - len(self._buf)), self._size - len(self._buf))))
        es, ens = _split(attr.entry_timeout)
        ats, atns = _split(attr.attr_timeout)
        ino = attr.st_ino
        kind = stat.S_IFMT(attr.st_mode) >> 12
        _DIRENTPLUS.pack_into(
            self._buf, pos, ino, attr.generation, es, ats, ens, atns, *_attr(attr), ino, next_id, n, kind
        )
        start = pos + _DIRENTPLUS_SIZE
        self._buf[start : start + n] = name
        self._pos = end
        return True

    def payload(self) -> memoryview:
        """The entries added, as one buffer (a view of it)."""
        return memoryview(self._buf)[: self._pos]
