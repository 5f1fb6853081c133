"""Reading blocks: :meth:`Store.open`, :meth:`Store.read_into`, :meth:`Store.read` and the
hot path of the mount (:meth:`Reading.open_hot`).

:class:`Reading` is the store's collaborator for every read. A read walks the block's
copies hottest first (:meth:`kvfs.placement.Placement.hottest_first`), checks a copy from a
persistent tier against the block's checksum (:meth:`kvfs.placement.Placement.fetch`, which
reads it with the lock let go), drops a bad one and tries the next; a copy read from a colder
tier is promoted when ``[policy] promote`` says so (:meth:`Reading.should_promote`). It also
counts the reads others serve from a copy they hold (a DRAM view, a leased copy, a block file
the kernel reads: :meth:`Reading.count_read`), and keeps the store's lookup and miss counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from .catalog import BlockRecord, Catalog
from .config import PromoteMode
from .errors import BlockNotFound, TierUnavailable
from .moves import Flow
from .names import normalize
from .opencopies import OpenCopies
from .peers import Elsewhere
from .placement import Placement
from .revalidation import SharedRecords
from .shared import SharedView
from .slot import TierSlot
from .tier import BlockRef, Tier

__all__ = ["READ_ATTEMPTS", "Reading"]

T = TypeVar("T")

READ_ATTEMPTS = 3  # a read retries when the block is replaced under it, or rediscovered


class Reading:
    """Reads of the blocks *placement* keeps (see the module doc). *copies* holds what
    :meth:`open` reads from persistent tiers; *elsewhere* and *records* ask peers and the
    shared tiers about a name; *promote* is ``[policy] promote``; *clock* stamps accesses."""

    def __init__(
        self,
        placement: Placement,
        catalog: Catalog,
        copies: OpenCopies,
        elsewhere: Elsewhere,
        records: SharedRecords,
        shared: SharedView,
        *,
        promote: PromoteMode,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.placement = placement
        self.catalog = catalog
        self.slots = placement.slots
        self.copies = copies
        self.elsewhere = elsewhere
        self.records = records
        self.shared = shared
        self.promote = promote
        self.clock = clock
        self.lookups = 0
        """Reads and read-like lookups counted (``StoreStatistics.lookups``)."""
        self.misses = 0
        """Reads that found no readable copy (``StoreStatistics.misses``)."""

    def open(self, name: str, *, count_hit: bool = True) -> BlockRef:
        """A view of block *name*'s bytes, valid until released (use ``with``).

        Tries the copies hottest first; a copy from a persistent tier is checked against the
        block's checksum, and a bad one is dropped, counted and skipped (when no local copy
        is good, the shared tiers are asked once more). A copy read from a colder tier is
        promoted per the promote policy. Raises :class:`BlockNotFound` when no copy is
        readable: never partial or wrong bytes; :class:`TierUnavailable` when the only
        copies are in tiers that do not answer now.
        """
        return self._read(name, count_hit, self.copies.fetch, _unpack_ref)

    def read_into(self, name: str, out: Any) -> int:
        """Copy the block into the writable buffer *out*; returns its length. Copies from
        persistent tiers are read straight into *out* and verified there."""
        view = memoryview(out).cast("B")

        def fetch(tier: Tier, n: str) -> BlockRef | tuple[int, int]:
            # volatile tiers hand out a ref (taken under the lock); the copy happens below,
            # outside it. Persistent tiers read straight into *out* and verify it there.
            return tier.open(n) if not tier.persistent else tier.read_into(n, view)

        def unpack(r: BlockRef | tuple[int, int]) -> tuple[Any, int]:
            return (r.data, r.checksum) if isinstance(r, BlockRef) else (view[: r[0]], r[1])

        result = self._read(name, True, fetch, unpack)
        if not isinstance(result, BlockRef):
            return result[0]
        with result:
            size = len(result.data)
            if len(view) < size:
                raise ValueError(f"buffer of {len(view)} bytes is too small for {name!r} ({size} bytes)")
            view[:size] = result.data
            return size

    def read(self, name: str) -> bytes:
        """The block's bytes (a copy)."""
        with self.open(name) as ref:
            return bytes(ref.data)

    def _read(self, name: str, count_hit: bool, fetch: Callable[[Tier, str], T], unpack: Callable[[T], Any]) -> T:
        """Read through the copies hottest first. *fetch(tier, name)* returns a result that
        *unpack* turns into ``(payload view, checksum)``; the first good result is returned."""
        name = normalize(name)
        self.elsewhere.refresh(name)
        p = self.placement
        rediscovered = False
        for attempt in range(READ_ATTEMPTS):
            flow = self._attempt(name, attempt == 0, count_hit, fetch, unpack, rediscovered)
            result, again, ask = p.drive(flow)
            if result is not None:
                return result
            if again:
                continue
            if not ask or not self.records.discover(name):
                break
            rediscovered = True  # a good copy another node holds (the local one was bad)
        with p.locked():
            self.misses += 1
        raise BlockNotFound(name)

    def _attempt(
        self,
        name: str,
        first: bool,
        count_hit: bool,
        fetch: Callable[[Tier, str], T],
        unpack: Callable[[T], Any],
        rediscovered: bool,
    ) -> Flow[tuple[T | None, bool, bool]]:
        """One try of :meth:`_read`, a flow (``Placement.drive``): ``(result, again, ask)``:
        the first good copy, or None and whether to read again (replaced while it was
        read) or to ask the shared tiers for the name."""
        p = self.placement
        rec = self.catalog.require(name)
        if first:
            self.lookups += 1
            if count_hit:
                rec.hits += 1
                rec.accessed = self.clock()
        result = yield from self.read_copies(rec, count_hit, fetch, unpack)
        if result is not None:
            return result, False, False
        if not p.is_current(rec) and self.catalog.get(name) is not None:
            return None, True, False  # replaced while it was read: read the new version
        # Copies still recorded are in tiers that failed or are unhealthy: the block
        # exists but cannot be read now, which is not the same as missing.
        down = [self.slots[i].name for i in rec.tier_indexes() if not self.slots[i].health.healthy]
        if down and p.is_current(rec):
            self.misses += 1
            raise TierUnavailable(
                f"{name!r}: no readable copy now; the tiers holding it are unavailable: {', '.join(down)}"
            )
        p.lose_if_empty(rec, "no readable copy")
        return None, False, bool(self.shared) and not rediscovered and not p.waiting_forbidden

    def read_copies(
        self, rec: BlockRecord, count_hit: bool, fetch: Callable[[Tier, str], T], unpack: Callable[[T], Any]
    ) -> Flow[T | None]:
        """A flow (``Placement.drive``): the first good copy of *rec*, hottest first, or
        None; a copy from a persistent tier is read in a step with the lock let go, and
        one from a colder tier is promoted when :meth:`should_promote` says so."""
        p = self.placement
        for slot in p.hottest_first(rec):
            result = yield from p.fetch(slot, rec, fetch, unpack)
            if result is None:
                continue
            slot.policy.touch(rec.name)
            c = slot.counters
            c.hits += 1
            c.bytes_read += rec.size
            if slot.index > 0 and count_hit and self.should_promote(rec):
                yield from p.promote(rec, unpack(result)[0], slot.index)
            return result
        return None

    def should_promote(self, rec: BlockRecord, *, extra_hit: bool = False) -> bool:
        """Whether ``[policy] promote`` copies *rec* up on this read (*extra_hit*: the read
        is not counted in ``rec.hits`` yet)."""
        mode = self.promote
        return mode is PromoteMode.ALWAYS or (mode is PromoteMode.SECOND_HIT and rec.hits + extra_hit >= 2)

    def open_hot(self, name: str) -> BlockRef | None:
        """A view of the block if its hottest copy is in a volatile tier (DRAM) and the
        store's lock is free now; ``None`` otherwise, never waiting: the caller then uses
        :meth:`open` from a worker thread. Counts a hit like :meth:`open`. *name* must be
        normalized. A revalidation that is due starts in the background."""
        p = self.placement
        if not p.lock.acquire(blocking=False):
            return None
        try:
            rec = self.catalog.get(name)
            if rec is None or not rec.tiers:
                return None
            slot = self.slots[next(rec.tier_indexes())]
            if slot.persistent or not slot.usable():
                return None
            try:
                ref = slot.tier.open(name)
            except BlockNotFound:
                return None
            self.count_read(rec, slot)
            return ref
        finally:
            p.lock.release()

    def count_read(self, rec: BlockRecord, slot: TierSlot) -> None:
        """Under the lock: a read of *rec* served from *slot* by someone outside the
        store (a DRAM view, a leased copy): a hit for the record, the policy and the tier.
        A revalidation that is due starts in the background."""
        self.lookups += 1
        rec.hits += 1
        rec.accessed = self.clock()
        slot.policy.touch(rec.name)
        c = slot.counters
        c.hits += 1
        c.bytes_read += rec.size
        if self.shared and self.records.due(rec):
            self.records.revalidate_later(rec)

    def count_reads(self, reads: list[tuple[BlockRecord, TierSlot]]) -> None:
        """Under the lock: :meth:`count_read` of each ``(record, slot)`` of a batch (a
        client's leases), with one reading of the clock for all of them."""
        now = self.clock()
        self.lookups += len(reads)
        shared = self.shared
        for rec, slot in reads:
            rec.hits += 1
            rec.accessed = now
            slot.policy.touch(rec.name)
            c = slot.counters
            c.hits += 1
            c.bytes_read += rec.size
            if shared and self.records.due(rec):
                self.records.revalidate_later(rec)


def _unpack_ref(ref: BlockRef) -> tuple[memoryview, int]:
    return ref.data, ref.checksum
