"""The catalog: what exists. Block records and their snapshots, the directory tree,
per-tier usage. No I/O.

Not thread-safe on its own: the store owns it and serializes access under its lock.
Directories are implicit (every parent of a block exists) or explicit (``mkdir``); an
empty explicit directory lives in memory only and is gone after a restart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import BlockExists, BlockNotFound, DirectoryNotEmpty, IsADirectory, NotADirectory
from .names import ROOT, parent_of, split

__all__ = ["BlockIdentity", "BlockRecord", "BlockStat", "Catalog", "DirTotals"]


class BlockIdentity(NamedTuple):
    """Which version of a block a name holds: what tells it from another version (its
    ``size`` and ``checksum``) and when it was sealed (``created``). The part of a
    :class:`BlockStat` a directory listing needs (``Store.probe_many``), cheaper to make."""

    size: int
    checksum: int
    created: float


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockStat:
    """A snapshot of one block's record (what ``Store.stat`` returns)."""

    name: str
    size: int
    checksum: int
    tiers: tuple[str, ...]
    """Names of the tiers holding a copy, hottest first."""
    pinned: bool
    hits: int
    created: float
    accessed: float
    parent: str | None = None
    """The previous block of its prefix chain, when the writer said (prefix-aware eviction)."""
    pin_expires: float | None = None
    """When a soft pin ends (the store's clock); None for a pin without expiry, or none."""

    @property
    def checksum_hex(self) -> str:
        return f"xxh3-64:{self.checksum:016x}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "checksum": self.checksum_hex,
            "tiers": list(self.tiers),
            "pinned": self.pinned,
            "hits": self.hits,
            "created": self.created,
            "accessed": self.accessed,
            "parent": self.parent,
            "pin_expires": self.pin_expires,
        }


@dataclass(slots=True, eq=False)
class BlockRecord:
    """One block. ``tiers`` is a bitmask over the store's tier indexes (bit 0 = hottest).

    Records are compared by identity: a replaced block gets a new record, so work queued
    for the old one (write-through) can tell it is stale.
    """

    name: str
    size: int
    checksum: int
    tiers: int = 0
    pinned: bool = False
    hits: int = 0
    created: float = 0.0
    accessed: float = 0.0
    parent: str | None = None
    checked: float = 0.0
    """When a shared tier last confirmed this block (the store revalidates after its
    negative-cache TTL, so a block deleted on another node is noticed)."""
    learn_shared: bool = False
    """Found in a local tier at start: which shared tiers hold it is not known yet, and
    the first revalidation asks (a bad local copy can then fall back to a shared one)."""
    moving: int = 0
    """Bitmask of the tiers whose copy is being moved out right now (a demotion in
    flight): not a victim again until the move commits or aborts."""
    pin_expires: float = 0.0
    """When its soft pin ends (the store's clock); 0 when it is not soft-pinned."""

    def stat(self, tier_names: Sequence[str]) -> BlockStat:
        """A snapshot; *tier_names* names the tiers by index."""
        return BlockStat(
            name=self.name,
            size=self.size,
            checksum=self.checksum,
            tiers=tuple(tier_names[i] for i in self.tier_indexes()),
            pinned=self.pinned,
            hits=self.hits,
            created=self.created,
            accessed=self.accessed,
            parent=self.parent,
            pin_expires=self.pin_expires or None,
        )

    def identity(self) -> BlockIdentity:
        return BlockIdentity(self.size, self.checksum, self.created)

    def tier_indexes(self) -> Iterator[int]:
        """Indexes of the tiers holding a copy, hottest first."""
        mask, i = self.tiers, 0
        while mask:
            if mask & 1:
                yield i
            mask >>= 1
            i += 1


@dataclass(slots=True, eq=False)
class DirTotals:
    """Running totals of everything at or under one directory: per tier the bytes counted
    against capacity (``used``) and the copies (``copies``); in all, the blocks and their
    payload bytes. Kept up to date on every change, so ``kvfs du`` of any directory is a
    dictionary lookup, not a walk."""

    used: list[int]
    copies: list[int]
    blocks: int = 0
    size: int = 0

    def empty(self) -> bool:
        return not self.blocks and not any(self.copies)


def _ancestors(name: str) -> Iterator[str]:
    """Every directory holding *name*, innermost first, ending with the root."""
    i = name.rfind("/")
    while i >= 0:
        name = name[:i]
        yield name
        i = name.rfind("/")
    yield ROOT


class Catalog:
    """Name → :class:`BlockRecord`, plus the directory tree and per-tier byte counts."""

    def __init__(self, ntiers: int) -> None:
        self.blocks: dict[str, BlockRecord] = {}
        # directory -> {child basename: True if the child is a directory}
        self.dirs: dict[str, dict[str, bool]] = {ROOT: {}}
        self.used = [0] * ntiers
        self.counts = [0] * ntiers
        self.totals: dict[str, DirTotals] = {}  # directory -> totals at or under it

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, name: str) -> BlockRecord | None:
        return self.blocks.get(name)

    def require(self, name: str) -> BlockRecord:
        rec = self.blocks.get(name)
        if rec is None:
            if name in self.dirs:
                raise IsADirectory(f"{name!r} is a directory")
            raise BlockNotFound(name)
        return rec

    # -- directories ---------------------------------------------------------------

    def is_dir(self, name: str) -> bool:
        return name in self.dirs

    def ensure_dir(self, name: str) -> None:
        """Create *name* and its parents as directories; fail if a block is in the way."""
        missing = []
        d = name
        while d not in self.dirs:
            if d in self.blocks:
                raise NotADirectory(f"{d!r} is a block, not a directory")
            missing.append(d)
            d = parent_of(d)
        for d in reversed(missing):
            parent, base = split(d)
            self.dirs[d] = {}
            self.dirs[parent][base] = True

    def mkdir(self, name: str, *, exist_ok: bool = False) -> None:
        if name in self.dirs:
            if exist_ok or name == ROOT:
                return
            raise BlockExists(f"{name!r} exists")
        if name in self.blocks:
            raise BlockExists(f"{name!r} is a block")
        parent = parent_of(name)
        if parent not in self.dirs:
            if parent in self.blocks:
                raise NotADirectory(f"{parent!r} is a block, not a directory")
            raise BlockNotFound(f"{parent!r} does not exist")
        self.ensure_dir(name)

    def rmdir(self, name: str) -> None:
        if name == ROOT:
            raise DirectoryNotEmpty("the root directory cannot be removed")
        if self.listdir(name):
            raise DirectoryNotEmpty(f"{name!r} is not empty")
        del self.dirs[name]
        parent, base = split(name)
        self.dirs[parent].pop(base, None)

    def listdir(self, name: str) -> dict[str, bool]:
        """``{basename: is_dir}`` of a directory (a live view: copy before releasing the lock)."""
        children = self.dirs.get(name)
        if children is None:
            if name in self.blocks:
                raise NotADirectory(f"{name!r} is a block")
            raise BlockNotFound(name)
        return children

    # -- blocks --------------------------------------------------------------------

    def add(self, rec: BlockRecord) -> None:
        """Insert a new record (its name must be free: :meth:`discard` a replaced one first)."""
        if rec.name in self.dirs:
            raise IsADirectory(f"{rec.name!r} is a directory")
        if rec.name in self.blocks:
            raise BlockExists(rec.name)
        parent, base = split(rec.name)
        self.ensure_dir(parent)
        self.blocks[rec.name] = rec
        self.dirs[parent][base] = False
        self._count_block(rec.name, 1, rec.size)

    def discard(self, rec: BlockRecord) -> None:
        """Remove *rec* (if it is still the record under its name); the parent dir stays."""
        if self.blocks.get(rec.name) is rec:
            del self.blocks[rec.name]
            parent, base = split(rec.name)
            self.dirs[parent].pop(base, None)
            self._count_block(rec.name, -1, -rec.size)

    def _dir_totals(self, d: str) -> DirTotals:
        t = self.totals.get(d)
        if t is None:
            n = len(self.used)
            t = self.totals[d] = DirTotals([0] * n, [0] * n)
        return t

    def _count_block(self, name: str, blocks: int, size: int) -> None:
        for d in _ancestors(name):
            t = self._dir_totals(d)
            t.blocks += blocks
            t.size += size
            if t.empty():
                del self.totals[d]

    def rename(self, rec: BlockRecord, new: str) -> None:
        """Move *rec* to *new*; *new* must be free (the store discards a replaced record)."""
        self.discard(rec)
        rec.name = new
        self.add(rec)

    def count_in(self, tier: int, footprint: int, name: str | None = None) -> None:
        """A copy of *footprint* bytes arrived in *tier*; with *name*, its directories'
        totals count it too (a reservation passes no name)."""
        self.used[tier] += footprint
        self.counts[tier] += 1
        if name is not None:
            self._count_copy(name, tier, footprint, 1)

    def count_out(self, tier: int, footprint: int, name: str | None = None) -> None:
        self.used[tier] -= footprint
        self.counts[tier] -= 1
        if name is not None:
            self._count_copy(name, tier, -footprint, -1)

    def _count_copy(self, name: str, tier: int, footprint: int, copies: int) -> None:
        for d in _ancestors(name):
            t = self._dir_totals(d)
            t.used[tier] += footprint
            t.copies[tier] += copies
            if t.empty():
                del self.totals[d]

    def under(self, directory: str) -> Iterator[BlockRecord]:
        """Every block at or below *directory* (walks the subtree, not the whole catalog)."""
        if directory in self.blocks:
            yield self.blocks[directory]
            return
        stack = [directory]
        while stack:
            d = stack.pop()
            for base, is_dir in list(self.dirs.get(d, {}).items()):
                child = f"{d}/{base}" if d else base
                if is_dir:
                    stack.append(child)
                else:
                    rec = self.blocks.get(child)
                    if rec is not None:
                        yield rec

    def names(self) -> Iterator[str]:
        return iter(self.blocks)
