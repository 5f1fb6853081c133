"""Where the daemon's work runs: on the trio loop, or in a worker thread, and under which bound.

The one place in the daemon that hands work to threads (``trio.to_thread.run_sync``) and
owns their limiters (``trio.CapacityLimiter``); a test (tests/repo/test_repo_workers.py)
keeps every other module of kvfs/, mount/, gpu/, tiers/ and tools/ from doing either.
One :class:`Workers` per daemon; each part is handed it, or just the bound method of
the kind of work it does, never the part that owns it.

=============  =================================  ==============================  =========
kind           method                             bound (threads at once)         abandoned
=============  =================================  ==============================  =========
tier *i*       :meth:`Workers.tier`               tier *i*'s ``concurrency``      yes
store meta     :meth:`Workers.meta`,              on the loop (``Store.nowait``);  yes
               :meth:`Workers.loop_or_tier`       on ``StoreBusy``, tier *i*'s
cpu            :meth:`Workers.cpu`                2, every session together       no
client         :meth:`Workers.client`             16                              no
control        :meth:`Workers.control`            8                               no
kernel         :meth:`Workers.kernel`             8                               no
background     :meth:`Workers.background`         1                               yes
events         :meth:`Workers.events`             1                               no
=============  =================================  ==============================  =========

- **tier *i***: a FUSE handler's store call that may touch tier *i* or a colder one (open,
  seal, delete of a block on disk, posix, s3). A hung shared tier fills only its own
  limiter: metadata of DRAM-only blocks never queues behind it.
- **store meta**: a store call that needs only the catalog and DRAM runs on the loop;
  when the store says it would wait (``StoreBusy``: its lock is busy, or the call must ask
  a shared tier) it moves to a thread under the limiter of the tier the store names (the
  hottest tier's when only the lock was busy, or the one :meth:`Workers.loop_or_tier`
  is given).
- **cpu**: memory-speed work on a big request or reply (the batch client's batches over
  4,096 names or ids, a big reply's encoding, a big batch's names normalized), so that
  the loop serves FUSE and every other client meanwhile; all sessions share the bound.
- **client**: a batch-client call that may wait (a copy-buffer session's copies,
  reserve, commit, abort, suspect, a session's leases given back when it ends, and a
  lookup or lease the store could not answer on the loop: :meth:`Workers.loop_or`).
- **control**: the ``kvfs`` tools' commands (stat, ls, du, df, pin, prefetch, evict,
  fsck, quota, hint).
- **kernel**: kernel cache invalidations (the kernel may make one wait for a request in
  flight on the same directory, so they never run inside a handler).
- **background**: the daemon's pass of write-through, lease expiry and sweeps.
- **events**: a burst of KV events translated and sent to the ZMQ publisher.

*Abandoned* work (``abandon_on_cancel``) is left running in its thread when the loop is
cancelled, so an unmount never waits on a hung tier; the rest is waited for. Work past a
bound waits its turn on the loop (never blocking it). One limiter per kind and per tier,
all owned here, rather than one for everything: with one, a hung shared tier's calls
would take every token and starve DRAM-only metadata, kernel invalidations and the tools.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, TypeVarTuple

import trio

from kvfs.errors import StoreBusy
from kvfs.store import Store

__all__ = ["BOUNDS", "MetaCall", "Offload", "SlowCall", "Workers"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

BOUNDS = {"cpu": 2, "client": 16, "control": 8, "kernel": 8, "background": 1, "events": 1}
"""Threads at once per kind of work other than a tier's (the module doc's table)."""


class SlowCall(Protocol):
    """:meth:`Workers.tier` (or :meth:`Workers.loop_or_tier`), as a part handed it sees it."""

    async def __call__(self, tier: int, fn: Callable[[*_Ts], _T], /, *args: *_Ts) -> _T: ...


class MetaCall(Protocol):
    """:meth:`Workers.meta`, as a part handed it sees it."""

    async def __call__(self, fn: Callable[[*_Ts], _T], /, *args: *_Ts) -> _T: ...


class Offload(Protocol):
    """One kind's method (:meth:`Workers.cpu`, :meth:`Workers.client`...), as a part handed
    it sees it: ``await offload(fn, *args)`` runs ``fn(*args)`` in a thread of that kind."""

    async def __call__(self, fn: Callable[[*_Ts], _T], /, *args: *_Ts) -> _T: ...


class Workers:
    """Every kind of work the daemon's loop hands off, each under its bound (module doc)."""

    def __init__(self, store: Store) -> None:
        self._nowait = store.nowait
        self._tiers = [trio.CapacityLimiter(max(1, t.config.concurrency)) for t in store.tiers]
        self._kinds = {kind: trio.CapacityLimiter(n) for kind, n in BOUNDS.items()}

    def limiter(self, kind: str | int) -> trio.CapacityLimiter:
        """The limiter of *kind* (a name of :data:`BOUNDS`, or a tier's index): for
        ``kvfs top``-style reports and tests, never to run work past this class."""
        return self._tiers[kind] if isinstance(kind, int) else self._kinds[kind]

    @staticmethod
    async def _thread(limiter: trio.CapacityLimiter, abandon: bool, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=abandon)

    # -- store calls of the FUSE handlers --------------------------------------------------

    async def tier(self, tier: int, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """Run a store call that may touch tier *tier* (or colder) in a worker thread under
        that tier's limiter, abandoned if the loop is cancelled (an unmount never waits on
        a hung tier)."""
        tier = min(max(tier, 0), len(self._tiers) - 1)
        return await self._thread(self._tiers[tier], True, fn, *args)

    async def meta(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A store metadata call: on the loop when it needs nothing but the catalog (the
        store answers local blocks from memory and revalidates them in the background);
        in a worker thread when the store says it would wait (StoreBusy), under the
        limiter of the tier it names (a shared tier to ask about a name this node does
        not know, a file to delete), or the hottest tier's when only its lock was busy.
        So metadata of local blocks never queues behind shared-tier calls."""
        try:
            return self._nowait(fn, *args)
        except StoreBusy as busy:
            return await self.tier(busy.tier if busy.tier is not None else 0, fn, *args)

    async def loop_or_tier(self, tier: int, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """*fn(*args)* on the loop when the store answers it at memory speed now, else
        as :meth:`tier` *tier* (the caller knows which tier the slow case touches)."""
        try:
            return self._nowait(fn, *args)
        except StoreBusy:
            return await self.tier(tier, fn, *args)

    # -- the other kinds -------------------------------------------------------------------

    async def cpu(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """Memory-speed work on a big request or reply, off the loop."""
        return await self._thread(self._kinds["cpu"], False, fn, *args)

    async def client(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A batch-client call that may wait (I/O, the store's lock, making room)."""
        return await self._thread(self._kinds["client"], False, fn, *args)

    async def control(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A ``kvfs`` tool command's store calls."""
        return await self._thread(self._kinds["control"], False, fn, *args)

    async def kernel(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A kernel cache invalidation (or page-cache fill)."""
        return await self._thread(self._kinds["kernel"], False, fn, *args)

    async def background(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A pass of the daemon's background work, abandoned if the loop is cancelled (a
        copy stuck in a hung tier must not hold the unmount)."""
        return await self._thread(self._kinds["background"], True, fn, *args)

    async def events(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """A burst of KV events sent to their publisher."""
        return await self._thread(self._kinds["events"], False, fn, *args)

    async def loop_or(self, then: Offload, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` (a store method) on the loop if it runs at memory speed
        now (``Store.nowait``), else in a thread of the kind *then* (one of the methods above)."""
        try:
            return self._nowait(fn, *args, **kwargs)
        except StoreBusy:
            return await then(functools.partial(fn, *args, **kwargs))
