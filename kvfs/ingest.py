"""Two-phase puts of blocks whose bytes a client writes itself into the DRAM arena.

The batch client (:mod:`kvfs.client`) puts a block without sending its bytes over the
socket: the daemon **reserves** an extent of the shared-memory arena (making room by
policy, as any placement does), the client **copies** the bytes straight into it through
its own mapping, and the daemon **commits** it — after checking the bytes against the
checksum the client sent, with its own reading of the extent — or **aborts** it (a
mismatch, a client that hung up or died before committing). Until it is committed no
reader sees the extent and its footprint counts in the tier's reservations, so capacity
holds at all times; once committed it is a block like any other (sealed, checksummed,
demoted and written through as usual: ``Store.commit``).

A reservation has a deadline: past it, it cannot be committed. Its extent is only given
back by :meth:`Ingest.abort` (the daemon calls it when the client aborts or its session
ends), never by the clock: the client may still hold a writable view of it, and an
extent reused under a live writer would let that writer's late bytes land in another
block. The daemon bounds what one session may hold reserved instead.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .blockfile import checksum as compute_checksum
from .catalog import BlockRecord, BlockStat
from .errors import BlockCorrupt, IsADirectory, KvfsError, NoSpace, NotADirectory, ReservationEnded
from .moves import Flow
from .names import normalize
from .placement import Placement
from .sealing import Sealing
from .shared import SharedView
from .slot import TierSlot
from .tier import Location

__all__ = ["Ingest", "Reservation", "ReservationState"]


class ReservationState(enum.StrEnum):
    """Where a :class:`Reservation` is: ``OPEN``, then ``COMMITTING``, then ``COMMITTED``;
    or ``ABORTED`` (from open or committing)."""

    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(eq=False)
class Reservation:
    """An extent reserved for block *name* (*size* bytes, *parent* in its chain): the
    client writes *location* (a file offset in the arena), then it is committed before
    *expires* (the ingest's clock) or aborted."""

    id: int
    name: str
    size: int
    parent: str | None
    location: Location
    expires: float
    slot: TierSlot = field(repr=False)
    offset: int = field(repr=False)
    """The extent's offset as the tier counts it (``location.offset`` is the file's)."""
    state: ReservationState = ReservationState.OPEN


class Ingest:
    """The reservations of the hottest tier of *placement* (see the module doc), sealed
    by *sealing*; *shared*: whether an adopted block learns its shared copies. *clock* is
    monotonic seconds (deadlines), *record_clock* stamps the records (the store's clock).
    Thread-safe; every change of room is made under the store's lock, no bytes are read
    under it."""

    def __init__(
        self,
        placement: Placement,
        sealing: Sealing,
        shared: SharedView,
        *,
        clock: Callable[[], float] = time.monotonic,
        record_clock: Callable[[], float] = time.time,
    ) -> None:
        self.placement = placement
        self.sealing = sealing
        self.shared = shared
        self.clock = clock
        self.record_clock = record_clock
        self._ids = itertools.count(1)
        self._open: dict[int, Reservation] = {}
        self._lock = threading.Lock()

    @property
    def slot(self) -> TierSlot | None:
        """The tier clients write into: the hottest, when it takes client-written extents."""
        slot = self.placement.slots[0]
        return slot if slot.tier.reservable else None

    def reserve(self, name: str, size: int, *, parent: str | None, ttl: float) -> Reservation:
        """Reserve an extent for block *name* of *size* bytes, to be committed within
        *ttl* seconds. Raises :class:`NoSpace` when the tier cannot take it now or ever,
        :class:`IsADirectory`/:class:`~kvfs.errors.NotADirectory` for a name that cannot
        be a block, and :class:`KvfsError` when the hottest tier is no arena."""
        name = normalize(name)
        self.sealing.check_writable(name)
        slot = self.slot
        if slot is None:
            raise KvfsError(
                "this mount's hottest tier is not a shared-memory arena: client puts need a dram tier first; "
                "write through the mount instead"
            )
        if size < 0:
            raise ValueError(f"a block's size cannot be negative (got {size})")
        cap = slot.capacity
        if cap is not None and slot.footprint(name, size) > cap:
            raise NoSpace(f"{name!r} ({size} bytes) is larger than the whole {slot.name} tier ({cap} bytes)")
        return self.placement.drive(self._reserve(slot, name, size, parent, ttl))

    def _reserve(self, slot: TierSlot, name: str, size: int, parent: str | None, ttl: float) -> Flow[Reservation]:
        """:meth:`reserve`'s work under the lock (a flow: demotions that make the room let go of it)."""
        self._check_name(name)
        offset = yield from self.placement.reserve_extent(slot, name, size)
        if offset is None:
            raise NoSpace(
                f"the {slot.name} tier has no room for {name!r} ({size} bytes) now: it is full of pinned, "
                "leased or reserved blocks; release leases, unpin blocks, or put fewer at once"
            )
        res = Reservation(
            id=next(self._ids),
            name=name,
            size=size,
            parent=parent,
            location=slot.tier.reserved_location(offset, size),
            expires=self.clock() + ttl,
            slot=slot,
            offset=offset,
        )
        with self._lock:
            self._open[res.id] = res
        return res

    def _check_name(self, name: str) -> None:
        """Fail now, not at commit, for a name that cannot be a block (under the lock)."""
        catalog = self.placement.catalog
        if catalog.is_dir(name):
            raise IsADirectory(f"{name!r} is a directory")
        d = name
        while (d := d.rpartition("/")[0]) and not catalog.is_dir(d):
            if catalog.get(d) is not None:
                raise NotADirectory(f"{d!r} is a block, not a directory")

    def get(self, res_id: int) -> Reservation | None:
        with self._lock:
            return self._open.get(res_id)

    def claim(self, res: Reservation) -> None:
        """Mark *res* being committed; :class:`ReservationEnded` if it is not open or its
        deadline passed (it stays reserved until aborted)."""
        with self._lock:
            if res.state is not ReservationState.OPEN or self._open.get(res.id) is not res:
                raise ReservationEnded(f"the reservation for {res.name!r} was already {res.state}")
            if self.clock() > res.expires:
                raise ReservationEnded(
                    f"the reservation for {res.name!r} passed its deadline before it was committed; put it again"
                )
            res.state = ReservationState.COMMITTING

    def verify(self, res: Reservation, checksum: int) -> None:
        """Check the reserved bytes (read through the daemon's own mapping) against the
        *checksum* the writer sent; :class:`BlockCorrupt` on a mismatch. Outside the lock."""
        actual = compute_checksum(res.slot.tier.reserved_view(res.offset, res.size))
        if actual != checksum:
            raise BlockCorrupt(
                f"{res.name!r}: the bytes in its reserved extent do not match the checksum the client sent "
                f"(xxh3-64:{checksum:016x}, found xxh3-64:{actual:016x}): the copy was torn or the extent written "
                "by someone else; the put was aborted"
            )

    def commit(self, res: Reservation, checksum: int) -> BlockStat:
        """Seal *res* as its block: its bytes are read and checked against *checksum*
        outside the lock (a mismatch aborts it and raises :class:`BlockCorrupt`), then the
        new block replaces the old version exactly as ``Store.put`` does. Raises
        :class:`ReservationEnded` when *res* is not open or past its deadline (it stays
        reserved until aborted)."""
        self.claim(res)
        try:
            self.verify(res, checksum)
            now = self.record_clock()
            rec = BlockRecord(res.name, res.size, checksum, created=now, accessed=now, parent=res.parent)
            with self.placement.locked():
                old = self.sealing.seal_begin(res.name)
                if old is not None:
                    for i in old.tier_indexes():
                        self.placement.slots[i].policy.remove(res.name)  # the new version's entry replaces it
                self.placement.commit_extent(res.slot, rec, res.offset)
                with self._lock:
                    res.state = ReservationState.COMMITTED
                    self._open.pop(res.id, None)
                return self.sealing.seal_end(rec, res.slot)
        finally:
            if res.state is ReservationState.COMMITTING:
                self.fail(res)

    def adopt(self, res: Reservation, checksum: int, *, source: str) -> BlockStat | None:
        """Seal *res*, filled from a peer (:mod:`kvfs.peers`), as its block: checked
        against *checksum* as :meth:`commit` does (:class:`BlockCorrupt` on a mismatch),
        but published only when this node holds no block of that name (one written here
        meanwhile is newer, and wins: None, the extent given back), and not queued for the
        write-through tiers (the writer's node writes it through). It learns its shared
        copies on its first use once the shared tiers' negative TTL has passed, as any block
        is revalidated: the peer's copy is as new as theirs, so the read that fetched it
        asks them nothing. *source* says where it came from (its ``stored`` event's detail)."""
        self.claim(res)
        try:
            self.verify(res, checksum)
            now = self.record_clock()
            rec = BlockRecord(res.name, res.size, checksum, created=now, accessed=now, parent=res.parent, checked=now)
            rec.learn_shared = bool(self.shared)
            with self.placement.locked():
                if self.placement.catalog.get(res.name) is not None:
                    return None
                self.sealing.seal_begin(res.name)
                self.placement.commit_extent(res.slot, rec, res.offset, source)
                with self._lock:
                    res.state = ReservationState.COMMITTED
                    self._open.pop(res.id, None)
                return self.sealing.seal_end(rec, res.slot, through=False)
        finally:
            if res.state is ReservationState.COMMITTING:
                self.fail(res)

    def abort(self, res: Reservation) -> bool:
        """Give the extent back; False if *res* was committed or aborted already, or is
        being committed right now (that commit then publishes it or gives it back)."""
        return self._give_back(res, ReservationState.OPEN)

    def fail(self, res: Reservation) -> None:
        """Give back the extent of a claimed reservation whose commit failed."""
        self._give_back(res, ReservationState.COMMITTING)

    def _give_back(self, res: Reservation, state: ReservationState) -> bool:
        with self._lock:
            if res.state is not state or self._open.pop(res.id, None) is None:
                return False
            res.state = ReservationState.ABORTED
        with self.placement.locked():
            self.placement.abort_extent(res.slot, res.name, res.size, res.offset)
        return True

    def close(self) -> None:
        """Abort every open reservation (the store is closing)."""
        with self._lock:
            left = list(self._open.values())
        for res in left:
            self.abort(res)

    def __len__(self) -> int:
        return len(self._open)
