"""Leases: a copy held for a reader outside the store, for a bounded time.

A client that reads a block's bytes itself (the batch client through the DRAM arena, a
GPU agent reading a disk block file with GDS) takes a :class:`Lease` on one copy. While
the lease is held:

- a **DRAM** copy's extent is never reused: the lease holds a :class:`~kvfs.tier.BlockRef`
  on it, so the bytes at the lease's offset stay the block's even if the block is
  replaced, evicted or deleted meanwhile (the extent is freed when the lease ends);
- a **disk** copy's file is never removed, replaced or renamed: its name is busy in the
  tier (:class:`~kvfs.slot.TierSlot`), so it is not a victim, a new version goes to
  another tier, and a delete asked for meanwhile runs when the lease ends.

Every lease has a deadline (``ttl``, at most :data:`MAX_TTL` seconds): a client that dies
without releasing cannot pin a copy forever. The store ends expired leases when its owner
calls ``Store.expire_leases()`` (the daemon does, from its background task). Leases are
the store side of the batch client (issue 12): :class:`Leases` takes, releases and
expires them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .catalog import BlockRecord
from .errors import KvfsError
from .placement import Placement
from .slot import TierSlot
from .tier import BlockRef, Location

__all__ = ["MAX_TTL", "Lease", "Leases"]

log = logging.getLogger("kvfs.store")

MAX_TTL = 600.0  # seconds: the longest lease the store hands out


@dataclass(eq=False, slots=True)
class Lease:
    """One held copy: block *name* (*size* bytes, *checksum*) in tier *tier*, its payload
    at *location* (None where the tier has no file to point at), until *expires*
    (monotonic seconds)."""

    id: int
    name: str
    tier: str
    size: int
    checksum: int
    location: Location | None
    expires: float
    slot: TierSlot = field(repr=False)
    ref: BlockRef | None = field(default=None, repr=False)
    """The extent held, for a volatile tier; a persistent copy is held by its busy name."""

    def to_json(self) -> dict[str, object]:
        loc = self.location
        return {
            "id": self.id,
            "name": self.name,
            "tier": self.tier,
            "size": self.size,
            "checksum": f"xxh3-64:{self.checksum:016x}",
            "path": loc.path if loc else None,
            "offset": loc.offset if loc else None,
            "length": loc.length if loc else None,
            "expires": self.expires,
        }


class Leases:
    """The leases handed out on *placement*'s copies, by id (see the module doc).
    *clock* is monotonic seconds. Thread-safe."""

    def __init__(self, placement: Placement, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.placement = placement
        self.clock = clock
        self._ids = itertools.count(1)
        self._leases: dict[int, Lease] = {}
        self._lock = threading.Lock()

    def deadline(self, ttl: float) -> float:
        if not ttl > 0:
            raise ValueError(f"a lease needs a positive ttl (got {ttl!r})")
        return self.clock() + min(ttl, MAX_TTL)

    def take(self, name: str, *, tier: int | None = None, ttl: float = 30.0) -> Lease:
        """Hold one local copy of block *name* (normalized): the copy in tier index
        *tier*, or the hottest local copy. Until :meth:`release` or *ttl* seconds, a DRAM
        extent is not reused and a disk file is not removed, replaced or renamed. Raises
        :class:`~kvfs.errors.BlockNotFound`, or :class:`~kvfs.errors.KvfsError` when
        there is no local copy to hold there."""
        expires = self.deadline(ttl)
        with self.placement.locked():
            lease = self._take(name, tier, expires)
        with self._lock:
            self._leases[lease.id] = lease
        return lease

    def take_many(
        self,
        names: list[str],
        *,
        ttl: float = 30.0,
        counted: Callable[[list[tuple[BlockRecord, TierSlot]]], None] | None = None,
    ) -> list[Lease | KvfsError]:
        """:meth:`take` of the hottest local copy of each name (normalized), under one
        acquisition of the store's lock: per name its lease or the error it met. The
        caller holds the store's lock already or not (it is re-entrant). *counted* is called
        under the lock with the ``(record, slot)`` of every lease taken (the reader's hits).

        A copy in a volatile tier (DRAM, the common case of a batch) is taken inline: its
        extent held and located in one look (:meth:`~kvfs.tier.Tier.open_located`, whose
        location the tier keeps per extent), no call per name beyond that; every other
        case goes through :meth:`take`'s own path, errors included."""
        expires = self.deadline(ttl)
        p = self.placement
        blocks = p.catalog.blocks
        slots = p.slots
        mask = p.local_mask
        volatile = [not s.persistent for s in slots]
        ids = self._ids
        out: list[Lease | KvfsError] = []
        reads: list[tuple[BlockRecord, TierSlot]] = []
        with p.locked():
            for name in names:
                rec = blocks.get(name)
                local = 0 if rec is None else rec.tiers & mask
                at = (local & -local).bit_length() - 1
                try:
                    if at < 0 or not volatile[at]:  # a miss, no local copy, a file: the careful path
                        lease = self._take(name, None, expires)
                    else:
                        assert rec is not None
                        slot = slots[at]
                        ref, location = slot.tier.open_located(name, rec.size)
                        lease = Lease(next(ids), name, slot.name, rec.size, rec.checksum, location, expires, slot, ref)
                except KvfsError as exc:
                    out.append(exc)
                    continue
                if rec is not None:
                    reads.append((rec, lease.slot))
                out.append(lease)
            if counted is not None and reads:
                counted(reads)
        with self._lock:
            held = self._leases
            for taken in out:
                if isinstance(taken, Lease):
                    held[taken.id] = taken
        return out

    def _take(self, name: str, tier: int | None, expires: float) -> Lease:
        """Under the store's lock: the lease of :meth:`take`, not yet registered."""
        p = self.placement
        rec = p.catalog.require(name)
        if tier is not None:
            slot = p.slots[tier]
            if slot.shared or not rec.tiers & slot.bit:
                raise KvfsError(f"tier {slot.name!r} holds no local copy of {name!r} to lease")
        else:
            local = rec.tiers & p.local_mask
            if not local:
                raise KvfsError(f"{name!r} has no local copy to lease (only shared tiers hold it)")
            slot = p.slots[(local & -local).bit_length() - 1]
        ref = None
        if slot.persistent:
            location = slot.tier.locate(name, rec.size)  # from the record: no I/O under the lock
            slot.hold(name)
        else:
            ref, location = slot.tier.open_located(name, rec.size)  # the ref holds the extent
        return Lease(
            id=next(self._ids),
            name=name,
            tier=slot.name,
            size=rec.size,
            checksum=rec.checksum,
            location=location,
            expires=expires,
            slot=slot,
            ref=ref,
        )

    def release(self, lease: Lease | int) -> bool:
        """End a lease (by object or id); False if it had already ended (released or expired)."""
        with self._lock:
            held = self._leases.pop(lease if isinstance(lease, int) else lease.id, None)
        if held is None:
            return False
        self._end(held)
        return True

    def get(self, lease_id: int) -> Lease | None:
        """The lease with *lease_id* if it is still held."""
        with self._lock:
            return self._leases.get(lease_id)

    def renew(self, lease_id: int, ttl: float) -> float | None:
        """Move a held lease's deadline to *ttl* seconds from now (at most :data:`MAX_TTL`);
        returns the new deadline, or None if it had already ended."""
        expires = self.deadline(ttl)
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is None:
                return None
            lease.expires = expires
            return expires

    def release_many(self, ids: list[int]) -> int:
        """End the leases with these ids; returns how many were still held. Inside
        ``Store.nowait`` it raises :class:`~kvfs.errors.StoreBusy` first, ending none, when
        ending one would delete a file (a delete that waited for the lease)."""
        p = self.placement
        if p.waiting_forbidden:
            with p.locked(), self._lock:
                for i in ids:
                    lease = self._leases.get(i)
                    if lease is not None and lease.ref is None and lease.name in lease.slot.doomed:
                        p.require_io(lease.slot.index, "deleting a file a lease held")
        with self._lock:
            held = [lease for lease in map(self._leases.pop, ids, itertools.repeat(None)) if lease is not None]
        for lease in held:
            self._end(lease)
        return len(held)

    def _end(self, lease: Lease) -> None:
        if lease.ref is not None:
            lease.ref.release()
            return
        with self.placement.locked():
            self.placement.release_hold(lease.slot, lease.name)

    def expire(self) -> int:
        """End every lease past its deadline; returns how many."""
        now = self.clock()
        with self._lock:
            gone = [lease for lease in self._leases.values() if lease.expires <= now]
            for lease in gone:
                del self._leases[lease.id]
        for lease in gone:
            log.warning("lease %d on %s in %s expired without being released", lease.id, lease.name, lease.tier)
            self._end(lease)
        return len(gone)

    def close(self) -> None:
        """End every lease (the store is closing)."""
        with self._lock:
            held = list(self._leases.values())
            self._leases.clear()
        for lease in held:
            self._end(lease)

    def __len__(self) -> int:
        return len(self._leases)
