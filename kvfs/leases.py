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
the store side of the batch client (issue 12).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .slot import TierSlot
from .tier import BlockRef, Location

__all__ = ["MAX_TTL", "Lease", "LeaseTable"]

MAX_TTL = 600.0  # seconds: the longest lease the store hands out


@dataclass(eq=False)
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


class LeaseTable:
    """The leases handed out, by id. *clock* is monotonic seconds. Thread-safe."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._ids = itertools.count(1)
        self._leases: dict[int, Lease] = {}
        self._lock = threading.Lock()

    def new_id(self) -> int:
        return next(self._ids)

    def deadline(self, ttl: float) -> float:
        if not ttl > 0:
            raise ValueError(f"a lease needs a positive ttl (got {ttl!r})")
        return self.clock() + min(ttl, MAX_TTL)

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases[lease.id] = lease

    def pop(self, lease_id: int) -> Lease | None:
        with self._lock:
            return self._leases.pop(lease_id, None)

    def expired(self) -> list[Lease]:
        """Remove and return every lease past its deadline."""
        now = self.clock()
        with self._lock:
            gone = [lease for lease in self._leases.values() if lease.expires <= now]
            for lease in gone:
                del self._leases[lease.id]
        return gone

    def all(self) -> list[Lease]:
        """Remove and return every lease (at close)."""
        with self._lock:
            out = list(self._leases.values())
            self._leases.clear()
        return out

    def __len__(self) -> int:
        return len(self._leases)
