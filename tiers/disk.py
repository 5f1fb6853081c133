"""The ``disk`` tier: local NVMe, one block file per block (kvfs.blockfile format).

Layout under the configured directory::

    blocks/<block path>     published block files
    tmp/<random>            files being written; renamed into blocks/ when whole

A block is written to ``tmp/`` and renamed into place, so a crash never leaves a partial
block under a real name; ``tmp/`` is emptied on start and the catalog is rebuilt from
``blocks/``. Reads verify the header and the payload checksum.

The directory belongs to one daemon: an exclusive ``flock`` on ``<path>/lock``, taken
before anything in it is touched, refuses a second daemon with a message naming the
holder (:mod:`kvfs.ownership`). ``fsync`` (off by default) makes each published block
durable before its name appears (docs/config.md, "Durability").

I/O: plain POSIX calls (``os.preadv``/``os.writev``) into the caller's buffers. With
``direct_io = true`` files are written and read with ``O_DIRECT`` through page-aligned
buffers; the default (``None``) uses buffered I/O, which measured faster on page-cache
backed reads (docs/benchmarks.md), and falls back to it where O_DIRECT is refused.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from typing import Any

from kvfs.blockfile import align_up, file_length, header_length
from kvfs.config import DiskConfig, TierKind
from kvfs.errors import BlockCorrupt, BlockNotFound, TierFull, TierUnavailable
from kvfs.ownership import lock_exclusive
from kvfs.tier import BackingFile, BlockInfo, BlockRef, Location, Tier, os_error

from .blockdir import BlockDirectory

__all__ = ["DiskTier"]

log = logging.getLogger("kvfs.tiers.disk")


class DiskTier(Tier):
    kind = TierKind.DISK
    persistent = True
    shared = False

    def __init__(self, config: DiskConfig) -> None:
        super().__init__(config)
        what = f"disk tier {config.name!r}"
        try:
            os.makedirs(config.path, exist_ok=True)
            self._lock_fd = os.open(config.path / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise TierUnavailable(f"{what}: cannot use {config.path}: {exc.strerror}") from exc
        try:
            lock_exclusive(self._lock_fd, str(config.path), what)
            self.dir = BlockDirectory(config.path, direct_io=bool(config.direct_io), fsync=config.fsync, beside=True)
            self.dir.clean_tmp()
        except OSError as exc:
            os.close(self._lock_fd)
            raise TierUnavailable(f"{what}: cannot use {config.path}: {exc.strerror}") from exc
        except BaseException:
            os.close(self._lock_fd)
            raise

    def footprint(self, name: str, size: int) -> int:
        # the payload alone when the header is an attribute beside it (blocks of an older
        # layout found at a restart take one header more than counted)
        return align_up(size) if self.dir.layout_beside(name) else file_length(name, size)

    def put(self, name: str, data: Any, checksum: int) -> None:
        try:
            self.dir.write(name, data, checksum)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise TierFull(f"disk tier {self.name!r} is out of space: {exc.strerror}") from exc
            raise os_error(f"disk tier {self.name!r}: write of {name}", exc) from exc

    def open(self, name: str) -> BlockRef:
        try:
            return self.dir.read(name)
        except OSError as exc:
            raise os_error(f"disk tier {self.name!r}: read of {name}", exc) from exc

    def open_file(self, name: str) -> BackingFile | None:
        try:
            return self.dir.open_file(name)
        except OSError as exc:
            raise TierUnavailable(f"disk tier {self.name!r}: open of {name} failed: {exc}") from exc

    def read_into(self, name: str, out: Any) -> tuple[int, int]:
        try:
            return self.dir.read_into(name, out)
        except OSError as exc:
            raise os_error(f"disk tier {self.name!r}: read of {name}", exc) from exc

    def delete(self, name: str) -> None:
        try:
            self.dir.delete(name)
        except OSError as exc:
            raise os_error(f"disk tier {self.name!r}: delete of {name}", exc) from exc

    def rename(self, old: str, new: str) -> None:
        try:
            self.dir.rename(old, new)
        except OSError as exc:
            raise os_error(f"disk tier {self.name!r}: rename", exc) from exc

    def stat(self, name: str) -> BlockInfo | None:
        try:
            return self.dir.stat(name)
        except BlockCorrupt:
            return None
        except OSError as exc:
            raise os_error(f"disk tier {self.name!r}: stat of {name}", exc) from exc

    def scan(self, prefix: str = "") -> Iterator[BlockInfo]:
        return self.dir.scan(prefix)

    def locate(self, name: str, size: int | None = None) -> Location:
        """The block file and where its payload starts (hold a lease while reading it):
        offset 0 when the file is exactly the payload (its header beside it), else after
        the header. With *size* (the record's) only the file's size is looked at; without
        it the header is read."""
        if size is None:
            info = self.stat(name)
            if info is None:
                raise BlockNotFound(name)
            size = info.size
        path = self.dir.path(name)
        try:
            on_disk = os.stat(path).st_size
        except FileNotFoundError as exc:
            raise BlockNotFound(name) from exc
        except OSError as exc:
            raise TierUnavailable(f"disk tier {self.name!r}: stat of {name} failed: {exc}") from exc
        # a header before the payload makes the file longer than the payload, always
        return Location(path=path, offset=0 if on_disk == size else header_length(name), length=size)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # drops the lock
            self._lock_fd = -1
