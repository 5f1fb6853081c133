"""Copies of blocks read from persistent tiers into the daemon's memory, one per version,
shared by every reader that holds it, and bounded in bytes.

A block whose hottest copy is on disk (or a shared tier) is read whole into memory when it
is opened (``Store.open``: the mount's readers, a version written from the old bytes) and
verified there. Every reader that opens the same version (name, checksum, size) while a
copy is held gets a view of that one copy instead of reading its own: twelve opens of a
40 MiB block hold 40 MiB, not 480. A copy is freed when its last reader lets it go.

All copies together are bounded by ``[mount] open_copies``: an open that would need a
new copy past it fails with :class:`~kvfs.errors.OutOfMemory` (``ENOMEM`` on the mount)
saying so, before anything is read. Opens of copies already held are never refused.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .catalog import Catalog
from .errors import OutOfMemory
from .tier import BlockRef, Tier
from .units import format_size

__all__ = ["OpenCopies", "default_open_copies"]

_MIN = 64 << 20


def default_open_copies() -> int:
    """A quarter of physical memory (at least 64 MiB): the default of ``[mount] open_copies``."""
    try:
        return max(_MIN, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4)
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        return 1 << 30


@dataclass(slots=True, eq=False)
class _Copy:
    data: memoryview
    checksum: int
    readers: int


class OpenCopies:
    """The held copies by version (see the module doc) of blocks of *catalog*; at most
    *limit* bytes in all (None: :func:`default_open_copies`). Thread-safe."""

    def __init__(self, catalog: Catalog, limit: int | None = None) -> None:
        self.catalog = catalog
        self.limit = default_open_copies() if limit is None else limit
        self._lock = threading.Lock()
        self._live: dict[tuple[str, int, int], _Copy] = {}
        self.bytes = 0
        """Bytes of the copies held now, and of those being read."""
        self.shared = 0
        """Opens served from a copy another reader held (no read, no memory)."""
        self.refused = 0
        """Opens refused for the limit."""

    def __len__(self) -> int:
        return len(self._live)

    def fetch(self, tier: Tier, name: str) -> BlockRef:
        """``Store.open``'s read of one copy: a volatile tier's own view (its memory is
        the tier's), a persistent tier's through :meth:`open`, for the version the
        catalog holds now (the store checks the result against its record)."""
        if not tier.persistent:
            return tier.open(name)
        rec = self.catalog.get(name)
        return self.open(tier, name, None if rec is None else (rec.checksum, rec.size))

    def open(self, tier: Tier, name: str, version: tuple[int, int] | None) -> BlockRef:
        """A view of block *name* read from *tier*: of the held copy of *version*
        ``(checksum, size)`` when there is one, else of a new copy read now (and held for
        the next readers while this one is). :class:`OutOfMemory` when a new copy would
        pass the limit; whatever *tier* raises."""
        if version is not None:
            ref = self._share((name, *version))
            if ref is not None:
                return ref
        need = version[1] if version is not None else 0
        self._charge(name, need)
        try:
            ref = tier.open(name)
        except BaseException:
            self._uncharge(need)
            raise
        return self._adopt(name, ref, need)

    def _share(self, key: tuple[str, int, int]) -> BlockRef | None:
        with self._lock:
            c = self._live.get(key)
            if c is None:
                return None
            c.readers += 1
            self.shared += 1
        return BlockRef(c.data, c.checksum, self._releaser(key, c))

    def _charge(self, name: str, size: int) -> None:
        with self._lock:
            if self.bytes + size > self.limit and size:
                self.refused += 1
                held = self.bytes
            else:
                self.bytes += size
                return
        raise OutOfMemory(
            f"{name!r} ({format_size(size)}) is only in a persistent tier, and reading it would take the copies of "
            f"blocks held open past [mount] open_copies ({format_size(self.limit)}, {format_size(held)} held): "
            "close some files (or release views) and open it again, or raise open_copies"
        )

    def _uncharge(self, size: int) -> None:
        with self._lock:
            self.bytes -= size

    def _adopt(self, name: str, ref: BlockRef, charged: int) -> BlockRef:
        """Hold *ref*'s bytes as the copy of its version (or, when another reader's copy
        of it came first, use that one and drop *ref*'s)."""
        key = (name, ref.checksum, len(ref.data))
        with self._lock:
            self.bytes += len(ref.data) - charged
            c = self._live.get(key)
            if c is not None:
                c.readers += 1
                self.bytes -= len(ref.data)
                self.shared += 1
            else:
                c = self._live[key] = _Copy(ref.data, ref.checksum, 1)
        if c.data is not ref.data:
            ref.release()
        return BlockRef(c.data, c.checksum, self._releaser(key, c))

    def _releaser(self, key: tuple[str, int, int], c: _Copy) -> Callable[[], None]:
        def release() -> None:
            with self._lock:
                c.readers -= 1
                if c.readers == 0 and self._live.get(key) is c:
                    del self._live[key]
                    self.bytes -= len(c.data)

        return release
