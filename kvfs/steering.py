"""What operators ask of the store through the tools: pin, prefetch, evict, du, fsck.

:class:`OperatorCommands` is the store's collaborator for these (``kvfs pin/prefetch/
evict/du/fsck`` reach them through the daemon's control socket and ``Store.pin`` etc.).
It changes placement only through :class:`~kvfs.placement.Placement`, so a demotion it
asks for is a two-phase move like any other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .blockfile import checksum as compute_checksum
from .catalog import BlockRecord, BlockStat, Catalog
from .errors import BlockCorrupt, BlockNotFound, LastCopy, NoSpace, Pinned, TierUnavailable
from .events import EventKind
from .lifetimes import Lifetimes
from .moves import Flow
from .names import normalize
from .peers import Elsewhere
from .placement import Placement
from .reading import Reading
from .slot import TierSlot, index_of

__all__ = ["OperatorCommands", "Usage"]

log = logging.getLogger("kvfs.store")


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """What the blocks at or under one path take: per tier ``(name, used bytes, blocks)``
    hottest first (bytes as counted against the tier's capacity), and in total the number
    of distinct blocks and their payload bytes."""

    tiers: tuple[tuple[str, int, int], ...]
    blocks: int
    size: int


class OperatorCommands:
    """Pin, prefetch, evict, usage and verify on the blocks *placement* keeps (see the
    module doc): *elsewhere* learns of names other nodes hold, *lifetimes* keeps soft
    pins, *reading* reads the copy a prefetch copies up."""

    def __init__(
        self, placement: Placement, catalog: Catalog, elsewhere: Elsewhere, lifetimes: Lifetimes, reading: Reading
    ) -> None:
        self.placement = placement
        self.catalog = catalog
        self.slots = placement.slots
        self.elsewhere = elsewhere
        self.lifetimes = lifetimes
        self.reading = reading

    def pin(self, name: str, pinned: bool = True, *, ttl: float | None = None) -> BlockStat:
        """Pin (or unpin) a block: a pinned block is never evicted from the tiers it is in.
        *ttl*: a soft pin, which ends by itself after *ttl* seconds (:mod:`kvfs.lifetimes`)."""
        if ttl is not None and not ttl > 0:
            raise ValueError(f"a soft pin lasts longer than 0 seconds (got {ttl})")
        name = normalize(name)
        self.elsewhere.refresh(name)
        p = self.placement
        with p.locked():
            rec = self.catalog.require(name)
            p.set_pinned(rec, pinned)
            self.lifetimes.pinned(rec, ttl)
            return rec.stat(p.names)

    def prefetch(self, name: str, tier: str | None = None) -> BlockStat:
        """Copy the block into *tier* (the hottest by default) now. Raises :class:`NoSpace`
        if the tier cannot make room, :class:`BlockNotFound` if no copy is readable."""
        name = normalize(name)
        k = 0 if tier is None else index_of(self.slots, tier)
        slot = self.slots[k]
        self.elsewhere.refresh(name)
        p = self.placement
        with p.locked():
            rec = self.catalog.require(name)
            if rec.tiers & slot.bit:
                slot.policy.touch(rec.name)
                return rec.stat(p.names)
        with self.reading.open(name, count_hit=False) as ref:
            return p.drive(self._prefetch(rec, slot, ref.data))

    def _prefetch(self, rec: BlockRecord, slot: TierSlot, data: memoryview) -> Flow[BlockStat]:
        p = self.placement
        if not p.is_current(rec):
            raise BlockNotFound(rec.name)
        if not rec.tiers & slot.bit and not (yield from p.copy_into(slot, rec, data, EventKind.PROMOTED)):
            raise NoSpace(f"tier {slot.name!r} cannot make room for {rec.name!r}")
        return rec.stat(p.names)

    def evict(self, name: str, tier: str | None = None, *, force: bool = False) -> BlockStat | None:
        """Drop the block's copies in *tier*, or in every local (non-shared) tier.

        A pinned block is refused with :class:`Pinned` unless *force* (its copies are then
        dropped as any other's; it stays pinned where it is left). A copy that is the
        block's last is first demoted to a colder tier; when none takes it,
        :class:`LastCopy` is raised unless *force*, which drops it (the block is gone and
        ``None`` is returned).
        """
        return self.placement.drive(self._evict(normalize(name), tier, force))

    def _evict(self, name: str, tier: str | None, force: bool) -> Flow[BlockStat | None]:
        p = self.placement
        rec = self.catalog.require(name)
        if rec.pinned and not force:
            raise Pinned(f"{name!r} is pinned; unpin it first (kvfs unpin), or use --force to evict it anyway")
        if tier is None:
            targets = [i for i in rec.tier_indexes() if not self.slots[i].shared]
        else:
            k = index_of(self.slots, tier)
            targets = [k] if rec.tiers & (1 << k) else []
        dropping = sum(1 << i for i in targets)
        for i in targets:
            slot = self.slots[i]
            if not p.is_current(rec) or not rec.tiers & slot.bit:
                continue  # moved meanwhile (the lock is let go while demoting)
            if not rec.tiers & ~dropping:
                saved = yield from p.demote(slot, rec, skip=dropping, admit=False)  # the operator keeps it
                if not p.is_current(rec):
                    return None
                if not saved and not force:
                    raise LastCopy(
                        f"{name!r}: the copy in {slot.name!r} is the last one and no colder tier "
                        "took it; use --force to drop it"
                    )
            p.drop_copy(slot, rec)
            slot.counters.evictions += 1
            p.emit(EventKind.EVICTED, rec, slot, "by request")
        p.lose_if_empty(rec, "evicted by request")
        return rec.stat(p.names) if rec.tiers else None

    # -- inspection (kvfs du, kvfs fsck) ------------------------------------------

    def usage(self, directory: str = "") -> Usage:
        """Bytes and blocks per tier at or under *directory* (a block name counts itself).

        From the catalog's running totals per directory: a dictionary lookup, however
        many blocks lie below, and no tier I/O.
        """
        directory = normalize(directory)
        p = self.placement
        n = len(self.slots)
        with p.locked():
            rec = self.catalog.get(directory)
            if rec is not None:
                per_tier = [(p.footprint(s, rec), 1) if rec.tiers & s.bit else (0, 0) for s in self.slots]
                blocks, size = 1, rec.size
            elif self.catalog.is_dir(directory):
                t = self.catalog.totals.get(directory)
                per_tier = list(zip(t.used, t.copies, strict=True)) if t else [(0, 0)] * n
                blocks, size = (t.blocks, t.size) if t else (0, 0)
            else:
                raise BlockNotFound(directory)
            return Usage(
                tiers=tuple((s.name, used, count) for s, (used, count) in zip(self.slots, per_tier, strict=True)),
                blocks=blocks,
                size=size,
            )

    def verify(self, name: str, *, repair: bool = False) -> dict[str, str | None]:
        """Read every copy of block *name* and check it against the block's size and
        checksum; returns ``{tier name: None if good, else why it is bad}``, hottest first.

        Without *repair* nothing changes (fsck reports). With *repair* a bad copy is
        dropped, counted and reported as a ``corrupt`` event exactly like a bad copy found
        by a read; a block left with no copy is removed. A copy in an unavailable tier is
        reported (``"tier unavailable: …"``) and never dropped. Copies that move while
        being checked (evicted, replaced) are skipped. :class:`BlockNotFound` if absent.
        """
        name = normalize(name)
        p = self.placement
        with p.locked():
            rec = self.catalog.require(name)
            order = list(rec.tier_indexes())
        out: dict[str, str | None] = {}
        for i in order:
            slot = self.slots[i]
            try:
                why = self._check(slot, rec)
            except TierUnavailable as exc:
                out[slot.name] = f"tier unavailable: {exc}"
                continue
            with p.locked():
                if not p.is_current(rec) or not rec.tiers & slot.bit or slot.is_busy(rec.name):
                    continue  # moved or replaced meanwhile: not this copy's fault
                out[slot.name] = why
                if why is not None and repair:
                    p.corrupt(slot, rec, why)
        if repair:
            with p.locked():
                p.lose_if_empty(rec, "no good copy left")
        return out

    def check_copy(self, name: str, tier: str) -> str | None:
        """Re-check the copy of *name* in *tier* that a reader outside the store found bad
        (a leased disk file that failed its checksum in the batch client): why it is bad,
        dropped, counted and announced like a bad copy found by a read (a file still
        leased by others is deleted when they release it); None when it checked good, or
        is no longer the block's copy. Raises :class:`BlockNotFound` if absent."""
        name = normalize(name)
        p = self.placement
        slot = self.slots[index_of(self.slots, tier)]
        with p.locked():
            rec = self.catalog.require(name)
            if not rec.tiers & slot.bit:
                return None
        why = self._check(slot, rec)
        with p.locked():
            if why is None or not p.is_current(rec) or not rec.tiers & slot.bit or rec.moving & slot.bit:
                return None
            p.corrupt(slot, rec, why)
            p.lose_if_empty(rec, "no good copy left")
        return why

    @staticmethod
    def _check(slot: TierSlot, rec: BlockRecord) -> str | None:
        """Read the copy of *rec* in *slot* (outside the lock): why it is bad, or None.
        :class:`TierUnavailable` passes through."""
        try:
            ref = slot.tier.open(rec.name)
        except BlockNotFound:
            return "the copy is missing"
        except BlockCorrupt as exc:
            return str(exc) or "the copy is corrupt"
        with ref:
            if len(ref.data) != rec.size:
                return f"the copy has {len(ref.data)} bytes, the block {rec.size}"
            if compute_checksum(ref.data) != rec.checksum:
                return "the copy does not match the block's checksum"
        return None
