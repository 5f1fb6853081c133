"""Store calls of the FUSE handlers: which tier's limiter each runs under, and which may
try the loop first.

Where work runs is decided by :mod:`kvfs.mount.workers` (the loop, or a worker thread
under a tier's limiter; docs/mount-internals.md, "Threads"); this module says, for the
handlers' store calls that are more than one store method, which tier a call may touch:
a seal of a small block into free DRAM is a memcpy and tries the loop; a delete or rename
runs under its coldest local copy's tier; room promised at a close is bookkeeping unless
it needs a demotion.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

from kvfs.pieces import Pieces
from kvfs.promises import Promise
from kvfs.store import BlockIdentity, BlockStat, Store

from .workers import SlowCall

__all__ = ["StoreCalls"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_SMALL_SEAL = 4 << 20  # blocks up to this size seal on the loop when DRAM has room (a memcpy)


class StoreCalls:
    """The FUSE handlers' store calls that take more than one store method (module doc)."""

    def __init__(self, store: Store, *, slow: SlowCall, loop_first: SlowCall) -> None:
        self.store = store
        self._slow = slow  # Workers.tier: in a thread under the tier's limiter
        self._loop_first = loop_first  # Workers.loop_or_tier: on the loop if the store can, else as _slow
        self._tiers = len(store.tiers)
        self._hot_volatile = not store.tiers[0].persistent

    def probe(self, name: str) -> tuple[bool, BlockStat | None]:
        """``(is_dir, stat or None)`` of *name*: the store half of a lookup (thread-safe)."""
        if self.store.is_dir(name):
            return True, None
        return False, self.store.lookup(name)

    def probe_many(self, names: list[str]) -> list[tuple[bool, BlockIdentity | None]]:
        """:meth:`probe` of each of *names* (a listing's entries; :meth:`Store.probe_many`)."""
        return self.store.probe_many(names)

    def fits_in_dram(self, n: int) -> bool:
        """True when a block of *n* bytes goes into free DRAM without evicting anything,
        so sealing it is a memory copy that may run on the loop."""
        if not self._hot_volatile or n > _SMALL_SEAL:
            return False
        free = getattr(self.store.tiers[0], "free_bytes", 0)
        return free >= n + _SMALL_SEAL

    def seal_tier(self) -> int:
        # sealing lands in the hottest tier but may demote evicted blocks to the next one
        return 1 if self._tiers > 1 else 0

    def coldest(self, st: BlockStat | None) -> int:
        """The tier whose limiter a delete or rename of *st* runs under: its coldest local
        copy's (the store updates shared copies in the background), or, for a block only
        shared tiers hold, the first of those."""
        if st is None or not st.tiers:
            return 0
        indexes = [self.store.tier_index(t) for t in st.tiers]
        local = [i for i in indexes if not self.store.tiers[i].shared]
        return local[-1] if local else indexes[0]

    async def change(self, st: BlockStat, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A store call that changes block *st* in every tier holding it (delete, rename):
        on the loop when those are all volatile (DRAM) and the store needs no tier I/O for
        it (else it says StoreBusy before changing anything), else in a thread bounded by
        the coldest tier's limiter."""
        if self._hot_volatile and st.tiers == (self.store.tiers[0].name,):
            return await self._loop_first(self.coldest(st), fn, *args)
        return await self._slow(self.coldest(st), fn, *args)

    async def put(self, name: str, data: Pieces, parent: str | None, promise: Promise | None = None) -> BlockStat:
        """Seal *data* (a file's pieces, not joined) as block *name* (the store call of a
        seal), in the room *promise* holds."""
        put = functools.partial(self.store.put, parent=parent, promise=promise)
        if self.fits_in_dram(len(data)):  # a memcpy into the arena: no thread, unless the store is busy
            return await self._loop_first(self.seal_tier(), put, name, data)
        return await self._slow(self.seal_tier(), put, name, data)

    async def promise(self, name: str, size: int) -> Promise:
        """Room for the seal of *size* bytes as *name* (at a close): bookkeeping, so on the
        loop unless making the room needs tier I/O (a demotion) or the store's lock is
        busy; then in a thread."""
        return await self._loop_first(self.seal_tier(), self.store.promise, name, size)
