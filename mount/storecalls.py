"""Store calls from the FUSE handlers: on the trio loop, or in a worker thread.

The handlers never block the loop (docs/mount-internals.md, "Threads"): a store call that
only touches the catalog and DRAM runs on the loop through ``Store.nowait`` (and moves to
a thread when the store says it would wait: ``StoreBusy``); one that may touch a
persistent or shared tier runs in a worker thread under that tier's
``trio.CapacityLimiter`` (``concurrency`` in its config), abandoned if the loop is
cancelled so that an unmount never waits on a hung tier. Seals of small blocks into free
DRAM are a memcpy and run on the loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, TypeVar, TypeVarTuple

import trio

from kvfs.promises import Promise
from kvfs.store import BlockStat, Store, StoreBusy

__all__ = ["MetaCall", "SlowCall", "StoreCalls"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_SMALL_SEAL = 4 << 20  # blocks up to this size seal on the loop when DRAM has room (a memcpy)


class SlowCall(Protocol):
    """:meth:`StoreCalls.slow`, as a part that is handed it sees it."""

    async def __call__(self, tier: int, fn: Callable[[*_Ts], _T], /, *args: *_Ts) -> _T: ...


class MetaCall(Protocol):
    """:meth:`StoreCalls.meta`, as a part that is handed it sees it."""

    async def __call__(self, fn: Callable[[*_Ts], _T], /, *args: *_Ts) -> _T: ...


class StoreCalls:
    """How each kind of store call is run (see the module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._limiters = [trio.CapacityLimiter(max(1, t.config.concurrency)) for t in store.tiers]
        self._hot_volatile = not store.tiers[0].persistent

    async def slow(self, tier: int, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """Run a store call that may touch tier *tier* (or colder) in a worker thread,
        abandoned if the loop is cancelled (an unmount never waits on a hung tier)."""
        tier = min(max(tier, 0), len(self._limiters) - 1)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiters[tier], abandon_on_cancel=True)

    async def meta(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A store metadata call: on the loop when it needs nothing but the catalog (the
        store answers local blocks from memory and revalidates them in the background);
        in a worker thread when the store says it would wait (StoreBusy), under the
        limiter of the tier it names (a shared tier to ask about a name this node does
        not know, a file to delete), or the hottest tier's when only its lock was busy.
        So metadata of local blocks never queues behind shared-tier calls."""
        try:
            return self.store.nowait(fn, *args)
        except StoreBusy as busy:
            limiter = self._limiters[busy.tier if busy.tier is not None else 0]
            return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=True)

    def probe(self, name: str) -> tuple[bool, BlockStat | None]:
        """``(is_dir, stat or None)`` of *name*: the store half of a lookup (thread-safe)."""
        if self.store.is_dir(name):
            return True, None
        return False, self.store.lookup(name)

    def probe_many(self, names: list[str]) -> list[tuple[bool, BlockStat | None]]:
        return [self.probe(n) for n in names]

    def fits_in_dram(self, n: int) -> bool:
        """True when a block of *n* bytes goes into free DRAM without evicting anything,
        so sealing it is a memory copy that may run on the loop."""
        if not self._hot_volatile or n > _SMALL_SEAL:
            return False
        free = getattr(self.store.tiers[0], "free_bytes", 0)
        return free >= n + _SMALL_SEAL

    def seal_tier(self) -> int:
        # sealing lands in the hottest tier but may demote evicted blocks to the next one
        return 1 if len(self._limiters) > 1 else 0

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
            try:
                return self.store.nowait(fn, *args)
            except StoreBusy:
                pass
        return await self.slow(self.coldest(st), fn, *args)

    async def put(
        self, name: str, data: bytes | bytearray, parent: str | None, promise: Promise | None = None
    ) -> BlockStat:
        """Seal *data* as block *name* (the store call of a seal), in the room *promise* holds."""
        put = functools.partial(self.store.put, parent=parent, promise=promise)
        if self.fits_in_dram(len(data)):
            try:  # a memcpy into the arena: no thread, unless the store is busy
                return self.store.nowait(put, name, data)
            except StoreBusy:
                pass
        return await self.slow(self.seal_tier(), put, name, data)

    async def promise(self, name: str, size: int) -> Promise:
        """Room for the seal of *size* bytes as *name* (at a close): bookkeeping, so on the
        loop unless making the room needs tier I/O (a demotion) or the store's lock is
        busy; then in a thread."""
        try:
            return self.store.nowait(self.store.promise, name, size)
        except StoreBusy:
            return await self.slow(self.seal_tier(), self.store.promise, name, size)
