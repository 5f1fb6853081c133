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

from kvfs.blockfile import file_length, header_length
from kvfs.config import DiskConfig, TierKind
from kvfs.errors import BlockCorrupt, BlockNotFound, TierFull, TierUnavailable
from kvfs.ownership import lock_exclusive
from kvfs.tier import BlockInfo, BlockRef, Location, Tier, os_error

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
            self.dir = BlockDirectory(config.path, direct_io=bool(config.direct_io), fsync=config.fsync)
            self.dir.clean_tmp()
        except OSError as exc:
            os.close(self._lock_fd)
            raise TierUnavailable(f"{what}: cannot use {config.path}: {exc.strerror}") from exc
        except BaseException:
            os.close(self._lock_fd)
            raise

    def footprint(self, name: str, size: int) -> int:
        return file_length(name, size)

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
        """The block file and where its payload starts (hold a lease while reading it).
        With *size* (the record's) nothing is read; without it the header is."""
        if size is None:
            info = self.stat(name)
            if info is None:
                raise BlockNotFound(name)
            size = info.size
        return Location(path=self.dir.path(name), offset=header_length(name), length=size)

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # drops the lock
            self._lock_fd = -1
