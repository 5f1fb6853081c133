"""Placement: where copies go, how room is made, and how bytes move between tiers.

:class:`Placement` owns the store's lock, the catalog's copy bookkeeping and every move
of bytes between tiers: placing a new block, evicting a victim (demoting it first when its
last copy is here), promoting a block read from a colder tier, copying a block down
(write-through, flush). It decides nothing about *which* block goes: the slots' eviction
policies name victims, and :meth:`Placement.admits` is the one place that decides whether
a colder tier takes a block on its way down.

Moves are two-phase, as vLLM's offloading manager does them (:mod:`kvfs.moves`): under the
lock the target's room is **reserved** (evicting by policy) and the copy is marked busy;
the **copy** runs with no lock held; under the lock again it is **completed** (the record
gains the copy) or undone (the reservation is returned; a copy left behind by a block that
changed meanwhile is deleted). The work under the lock is a *flow*, a generator that yields
each step where its I/O goes; :meth:`Placement.drive`, at the top of the store call, runs
it and lets go of the lock for each step by ending its ``with`` scope: the lock is never
let go under a caller. Volatile tiers (DRAM) answer at memory speed, so their copies are
made under the lock; nothing that touches a persistent tier (a file, an object) ever runs
while the lock is held, so a DRAM hit never waits behind a demotion or an upload.

Deletes of persistent copies are deferred the same way: the record forgets the copy under
the lock and the file is removed by the same thread once it lets go of the lock (or, for
shared tiers, by the write-through queue in the background). While a copy's name is busy
in a tier (being written, deleted, or leased) it is never chosen as a victim, never
overwritten and never deleted; a delete asked for meanwhile runs when it is idle.

Namespaces (:mod:`kvfs.namespaces`) with a quota in a tier are held to it the same way:
room is made for a copy within the namespace's quota first, evicting the namespace's own
blocks by its own order, and the bytes of copies in flight are reserved against it.

Callers that must never wait (the FUSE loop, through ``Store.nowait``) run with the lock
taken without blocking; any step that would need tier I/O raises
:class:`~kvfs.errors.StoreBusy` naming the tier, before changing anything it cannot finish.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from .backlog import WriteThroughQueue
from .catalog import BlockRecord, Catalog
from .errors import BlockNotFound, NoSpace, StoreBusy, TierFull, TierUnavailable
from .events import EventKind, EventLog
from .moves import CopyRead, CopyWrite, Flow, Written
from .namespaces import Namespaces, NamespaceState, PartitionedPolicy
from .policies import EvictionPolicy
from .slot import TierSlot
from .tier import BlockRef, Tier

__all__ = ["GivenUp", "Placement"]

log = logging.getLogger("kvfs.store")

T = TypeVar("T")
R = TypeVar("R")


class GivenUp(Protocol):
    """Room held for a write that will not come (a :class:`kvfs.promises.Promise` given
    up): :meth:`Placement.settle_promises` ends it under the lock, giving the room back."""

    def give_back(self) -> bool: ...


_TIER_FULL_RETRIES = 8  # evictions tried when a tier says it is full although the count says not


class _ThreadState(threading.local):
    """Per thread: how deep in the lock, whether it must not wait, deletes to run later."""

    def __init__(self) -> None:
        self.depth = 0
        self.nowait = 0
        self.deferred: list[tuple[TierSlot, str]] = []


class Placement:
    """Copies of blocks across *slots* (hottest first), recorded in *catalog*.

    *queue* receives the background work (write-through copies, deletes on shared
    tiers); *events* gets an event per move; *clock* returns seconds; *namespaces* holds
    the quotas to keep (none by default).
    """

    def __init__(
        self,
        slots: Sequence[TierSlot],
        catalog: Catalog,
        queue: WriteThroughQueue,
        *,
        events: EventLog,
        clock: Callable[[], float],
        namespaces: Namespaces | None = None,
    ) -> None:
        self.slots = list(slots)
        self.namespaces = namespaces if namespaces is not None else Namespaces(tier_names=[s.name for s in slots])
        self.catalog = catalog
        self.queue = queue
        self.events = events
        self.clock = clock
        self.lock = threading.RLock()
        self._thread = _ThreadState()
        self.persistent_mask = sum(s.bit for s in self.slots if s.persistent)
        self.shared_mask = sum(s.bit for s in self.slots if s.shared)
        self.local_mask = sum(s.bit for s in self.slots if not s.shared)
        self.local_persistent_mask = self.persistent_mask & self.local_mask
        self.given_up: deque[GivenUp] = deque()
        """Promises of room given up outside the lock (:mod:`kvfs.promises`), whose room
        :meth:`settle_promises` gives back (appends are thread-safe)."""

    # -- the lock ------------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock; persistent deletes queued meanwhile run after it is let go."""
        state = self._thread
        self.lock.acquire()
        state.depth += 1
        try:
            yield
        finally:
            state.depth -= 1
            self.lock.release()
            if state.depth == 0 and state.deferred:
                self._run_deferred()

    def nowait(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args)`` only if the lock is free now, holding it throughout; raises
        :class:`StoreBusy` at once otherwise, or when *fn* would need tier I/O."""
        if not self.lock.acquire(blocking=False):
            raise StoreBusy("the store is busy")
        state = self._thread
        state.depth += 1
        state.nowait += 1
        try:
            return fn(*args, **kwargs)
        finally:
            state.nowait -= 1
            state.depth -= 1
            self.lock.release()
            if state.depth == 0 and state.deferred:  # pragma: no cover - require_io prevents it
                self._run_deferred()

    @property
    def waiting_forbidden(self) -> bool:
        """True inside :meth:`nowait`: nothing may wait or do tier I/O."""
        return self._thread.nowait > 0

    def require_io(self, tier: int, what: str = "tier I/O") -> None:
        """Raise :class:`StoreBusy` (naming *tier*) if this thread must not do tier I/O."""
        if self._thread.nowait:
            raise StoreBusy(f"{what} on tier {self.slots[tier].name!r} is needed", tier=tier)

    @property
    def holds_lock(self) -> bool:
        """True when this thread holds the store's lock (a move's I/O phase must not)."""
        return self._thread.depth > 0

    def drive(self, flow: Flow[R]) -> R:
        """Run *flow* (a store call's work under the lock) to its end and return its value.
        Call it at the top of the store call, holding no lock: *flow* runs under the lock,
        and each step it yields (:mod:`kvfs.moves`, prepared under the lock) does its I/O
        here once the ``with`` scope of the lock has ended; then *flow* goes on under the
        lock (the step's ``complete`` re-checks what changed meanwhile). A step that fails
        unexpectedly is aborted and its error raised in *flow*. Inside a call that holds
        the lock (``Store.nowait``: ``require_io`` refuses any step first) *flow* runs
        as a plain call, and a step it yields is an error."""
        if self._thread.depth:
            with self.locked():
                try:
                    step = next(flow)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                step.abort()
                error: Exception = (
                    StoreBusy("tier I/O is needed")  # Store.nowait: the caller runs the call in a thread instead
                    if self._thread.nowait
                    else RuntimeError("tier I/O is needed inside a call that holds the store's lock")
                )
                flow.throw(error)
                raise error  # pragma: no cover - flow.throw raises it
        with self.locked():
            try:
                step = next(flow)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        while True:
            try:
                step.run()  # the lock is not held: the with scope above ended
                error_in_io: BaseException | None = None
            except BaseException as exc:  # noqa: BLE001 - raised in the flow, under the lock, after the abort
                error_in_io = exc
            with self.locked():
                try:
                    if error_in_io is None:
                        step = flow.send(None)
                    else:
                        step.abort()
                        step = flow.throw(error_in_io)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]

    # -- events and bookkeeping (under the lock) ----------------------------------

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.slots]

    def emit(self, kind: EventKind, rec: BlockRecord | str, slot: TierSlot | None = None, detail: str = "") -> None:
        if isinstance(rec, str):
            self.events.emit(self.clock(), kind, rec, None if slot is None else slot.name, 0, detail)
        else:
            self.events.emit(
                self.clock(), kind, rec.name, None if slot is None else slot.name, rec.size, detail, rec.parent
            )

    def footprint(self, slot: TierSlot, rec: BlockRecord) -> int:
        return slot.footprint(rec.name, rec.size)

    def policy_insert(self, slot: TierSlot, rec: BlockRecord) -> None:
        # Policies are keyed by block *name*, not by record: a name keeps its history (ARC's
        # and S3-FIFO's ghost lists) across a rewrite, and a parent is named before it exists.
        slot.policy.insert(rec.name, self.footprint(slot, rec), rec.parent)

    def add_copy(self, slot: TierSlot, rec: BlockRecord) -> None:
        rec.tiers |= slot.bit
        self.catalog.count_in(slot.index, self.footprint(slot, rec), rec.name)
        if not rec.pinned:
            self.policy_insert(slot, rec)

    def set_pinned(self, rec: BlockRecord, pinned: bool) -> None:
        """Pin or unpin *rec*: a pinned block is in no policy, so never a victim."""
        if pinned and not rec.pinned:
            for i in rec.tier_indexes():
                self.slots[i].policy.remove(rec.name)
        elif not pinned and rec.pinned:
            for i in rec.tier_indexes():
                self.policy_insert(self.slots[i], rec)
        rec.pinned = pinned

    def forget_copy(self, slot: TierSlot, rec: BlockRecord, *, policy: bool = True) -> None:
        """Drop *slot* from the record (the copy is gone, overwritten or someone else's).
        ``policy=False`` leaves the policy entry, which belongs to a replacing record."""
        if rec.tiers & slot.bit:
            rec.tiers &= ~slot.bit
            self.catalog.count_out(slot.index, self.footprint(slot, rec), rec.name)
            if policy:
                slot.policy.remove(rec.name)

    def drop_copy(self, slot: TierSlot, rec: BlockRecord) -> None:
        """Forget the copy in *slot* and delete it: at once in a volatile tier, after the
        lock is let go in a local persistent one, in the background in a shared one."""
        if slot.persistent and not slot.shared:
            self.require_io(slot.index, "deleting a file")
        self.forget_copy(slot, rec)
        self.delete_copy(slot, rec.name)

    def delete_copy(self, slot: TierSlot, name: str, *, cutoff: float | None = None) -> None:
        """Delete what *slot* holds under *name* (the record no longer counts it). With
        *cutoff* (shared tiers), only a copy written before it (seconds since the epoch):
        one another node wrote since is kept (``Tier.expire``)."""
        if not slot.persistent:
            slot.tier.delete(name)
        elif slot.shared:
            self.queue.delete(name, slot.index, cutoff=cutoff)
            slot.hold(name)  # released when the delete ran: nothing re-publishes it first
        elif slot.is_busy(name):
            slot.doomed.add(name)  # leased or in flight: deleted once idle
        else:
            slot.hold(name)
            self._thread.deferred.append((slot, name))

    def release_hold(self, slot: TierSlot, name: str) -> None:
        """Under the lock: one hold on *name* in *slot* ended; a delete that waited for it
        is queued for this thread to run once it lets go of the lock."""
        slot.unhold(name)
        if not slot.is_busy(name) and name in slot.doomed:
            slot.doomed.discard(name)
            self.delete_copy(slot, name)

    def _run_deferred(self) -> None:
        """Delete the local files queued by this thread (outside the lock)."""
        state = self._thread
        while state.deferred:
            slot, name = state.deferred.pop()
            try:
                slot.tier.delete(name)
            except TierUnavailable as exc:
                slot.failed(exc)  # an orphan file is harmless: it fails the checksum or is replaced
            with self.lock:
                state.depth += 1
                try:
                    self.release_hold(slot, name)
                finally:
                    state.depth -= 1

    def lose_if_empty(self, rec: BlockRecord, why: str) -> None:
        if rec.tiers == 0 and self.catalog.get(rec.name) is rec:
            self.catalog.discard(rec)
            self.emit(EventKind.REMOVED, rec, detail=why)

    def is_current(self, rec: BlockRecord) -> bool:
        return self.catalog.get(rec.name) is rec

    def corrupt(self, slot: TierSlot, rec: BlockRecord, why: str) -> None:
        """Count and drop a bad copy (under the lock)."""
        slot.counters.corrupt += 1
        log.error("corrupt copy of %s in tier %s dropped: %s", rec.name, slot.name, why)
        self.emit(EventKind.CORRUPT, rec, slot, why)
        if self.is_current(rec) and rec.tiers & slot.bit:
            self.drop_copy(slot, rec)

    # -- reading a copy -------------------------------------------------------------

    def hottest_first(self, rec: BlockRecord) -> Iterator[TierSlot]:
        """Under the lock: the tiers holding a copy of *rec*, hottest first, each once.
        ``rec.tiers`` is read again at every step (a caller may let the lock go between
        steps, to read a copy), and the walk ends when *rec* is no longer the block's
        record. The one walk over a record's copies: ``Reading`` and ``BackingFiles``."""
        tried = 0
        while self.is_current(rec):
            left = rec.tiers & ~tried
            if not left:
                return
            i = (left & -left).bit_length() - 1
            tried |= 1 << i
            yield self.slots[i]

    def start_read(
        self, slot: TierSlot, rec: BlockRecord, fetch: Callable[[Tier, str], T], unpack: Callable[[T], Any]
    ) -> T | CopyRead[T] | None:
        """Under the lock, the first phase of reading *rec*'s copy in *slot* with
        ``fetch(tier, name)``: None when the tier is not usable now or (a volatile tier)
        holds no copy; from a volatile tier, the result itself (memory speed, under the
        lock); from a persistent one, a prepared :class:`~kvfs.moves.CopyRead` the caller
        runs where it holds no lock (:meth:`drive`) and completes under it again
        (:class:`StoreBusy` inside :meth:`nowait`). *unpack* turns the result into
        ``(payload view, checksum)``."""
        if not slot.usable():
            return None
        if not slot.persistent:  # volatile tiers answer at memory speed: no need to leave the lock
            if not rec.tiers & slot.bit or not self.is_current(rec):
                return None
            try:
                return fetch(slot.tier, rec.name)
            except BlockNotFound:
                self.forget_copy(slot, rec)
                return None
        self.require_io(slot.index, "reading a copy")
        return CopyRead(self, slot, rec, fetch, unpack)

    def fetch(
        self, slot: TierSlot, rec: BlockRecord, fetch: Callable[[Tier, str], T], unpack: Callable[[T], Any]
    ) -> Flow[T | None]:
        """``fetch(tier, name)`` the copy in *slot*, verified against the record; None if there
        is no good copy there now (a bad or vanished copy is dropped from the record).
        A flow (:meth:`drive`): a persistent tier is read in a step (:class:`CopyRead`)."""
        found = self.start_read(slot, rec, fetch, unpack)
        if not isinstance(found, CopyRead):
            return found
        yield found
        return found.complete()

    def open_copy(self, slot: TierSlot, rec: BlockRecord) -> Flow[BlockRef | None]:
        """A verified view of the copy in *slot* to copy from, or None (a flow)."""
        return (yield from self.fetch(slot, rec, _open_in, _unpack_ref))

    # -- room ------------------------------------------------------------------------

    def victim(self, slot: TierSlot, skipped: list[str], order: EvictionPolicy | None = None) -> BlockRecord | None:
        """The record the policy of *slot* would evict next (None when none can go);
        *order*: a namespace's own order in the slot instead of the whole tier's. Busy
        copies are set aside in *skipped* (the caller puts them back)."""
        policy = slot.policy
        order = policy if order is None else order
        while True:
            name = order.victim()
            if name is None:
                return None
            rec = self.catalog.get(name)
            if rec is not None and rec.tiers & slot.bit and not rec.pinned and not rec.moving & slot.bit:
                if not slot.is_busy(name):
                    return rec
                skipped.append(name)
            policy.remove(name)  # an entry without an evictable copy, or a busy one for now

    def _restore(self, slot: TierSlot, skipped: list[str]) -> None:
        for name in skipped:
            rec = self.catalog.get(name)
            if rec is not None and rec.tiers & slot.bit and not rec.pinned:
                self.policy_insert(slot, rec)

    def make_room(
        self, slot: TierSlot, need: int, *, lossless: bool = False, ns: NamespaceState | None = None
    ) -> Flow[bool]:
        """Evict from *slot* until *need* more bytes fit (a flow: the lock is let go while a
        victim's last copy is demoted); False if they cannot. *lossless*: never
        drop a block's last copy to make the room (the flush at unmount). *ns*: the
        bytes are the namespace's, so they must also fit its quota in *slot*, made by
        evicting its own blocks first (never another namespace's for its quota)."""
        i = slot.index
        cap = slot.capacity
        if cap is None and (ns is None or ns.quota[i] is None):
            return True
        if cap is not None and need > cap:
            return False
        skipped: list[str] = []
        try:
            self.settle_promises()
            while True:  # both bounds are checked again after each eviction: the lock may be let go
                self.absorb_held(slot)  # an evicted copy a reader holds frees nothing yet
                if ns is not None and self.ns_over(ns, slot, need):
                    order, quota = ns.parts[i], ns.quota[i]
                    fits = quota is not None and need <= quota
                    victim = self.victim(slot, skipped, order) if fits and order is not None else None
                    if victim is not None and (yield from self.evict_copy(slot, victim, "quota", lossless=lossless)):
                        ns.evictions[i] += 1
                        continue
                    return False
                if cap is not None and self.catalog.used[i] + slot.held + slot.reserved + need > cap:
                    victim = self.victim(slot, skipped)
                    if victim is None or not (yield from self.evict_copy(slot, victim, lossless=lossless)):
                        return False
                    continue
                return True
        finally:
            self._restore(slot, skipped)

    # -- namespace quotas ------------------------------------------------------------

    def ns_used(self, ns: NamespaceState, tier: int) -> int:
        """Bytes *ns*'s copies take in *tier*: the catalog's running total of its directory."""
        t = self.catalog.totals.get(ns.path)
        return 0 if t is None else t.used[tier]

    def ns_over(self, ns: NamespaceState | None, slot: TierSlot, need: int) -> bool:
        """True when *need* more bytes of *ns* do not fit its quota in *slot* now: its
        copies, its dropped copies readers still hold and its reservations count."""
        if ns is None:
            return False
        i = slot.index
        quota = ns.quota[i]
        return quota is not None and self.ns_used(ns, i) + ns.held[i] + ns.reserved[i] + need > quota

    def settle_promises(self) -> None:
        """Under the lock: give back the room of the promises given up since (:mod:`kvfs.promises`)."""
        while self.given_up:
            self.given_up.popleft().give_back()

    def absorb_held(self, slot: TierSlot) -> None:
        """Under the lock: count what *slot*'s tier reports of dropped copies readers still
        hold (``Tier.held_changes``) in ``slot.held`` and in the held bytes of the
        namespace of the name each had, until its last reader lets go. Their room is not
        free, whoever holds them: without this a namespace holding its old versions open
        passed its quota unseen and the tier, fuller than its count said, evicted anyone's
        blocks to find the room."""
        if not slot.tier.keeps_held:
            return
        for change in slot.tier.held_changes():
            if change.size > 0:
                ns = self.namespaces.of(change.name) if self.namespaces else None
                slot.held_by[change.token] = (ns, change.size)
                slot.held += change.size
                if ns is not None:
                    ns.held[slot.index] += change.size
                continue
            counted = slot.held_by.pop(change.token, None)
            if counted is not None:
                ns, size = counted
                slot.held -= size
                if ns is not None:
                    ns.held[slot.index] -= size

    def set_quota(self, ns: NamespaceState, slot: TierSlot, quota: int | None) -> None:
        """Give *ns* a quota of *quota* bytes in *slot* (None: none), under the lock. The
        first quota in a tier wraps its policy (:class:`PartitionedPolicy`); a namespace's
        first quota there builds its own order from the blocks it has there, least
        recently used first. Lowering a quota below the use does not evict by itself:
        :meth:`make_room` with ``need=0`` does (``Store.set_quota``)."""
        i = slot.index
        if quota is not None and ns.parts[i] is None:
            if not isinstance(slot.policy, PartitionedPolicy):
                slot.policy = PartitionedPolicy(slot.policy, self.namespaces, i)
            part = self.namespaces.new_part()
            held = [r for r in self.catalog.under(ns.path) if r.tiers & slot.bit and r.name in slot.policy]
            for rec in sorted(held, key=lambda r: r.accessed):
                part.insert(rec.name, self.footprint(slot, rec), rec.parent)
            ns.parts[i] = part
        elif quota is None:
            ns.parts[i] = None
        ns.quota[i] = quota

    def evict_copy(self, slot: TierSlot, rec: BlockRecord, detail: str = "", *, lossless: bool = False) -> Flow[bool]:
        """Remove the copy in *slot* to make room. Demote it first when no colder local
        tier holds it: into any colder tier when it is the last copy here or colder
        (write-back), into a colder local tier when only shared tiers hold it (local
        tiers cache what the shared ones hold; nothing is lost if none takes it). A flow;
        demoting lets go of the lock. False when nothing was freed: pinned meanwhile,
        or (*lossless*) a last copy no colder tier took."""
        colder = rec.tiers >> (slot.index + 1) << (slot.index + 1)
        if not colder & self.local_mask:
            self.require_io(slot.index + 1 if slot.index + 1 < len(self.slots) else slot.index, "a demotion")
            demoted = yield from self.demote(slot, rec, skip=self.shared_mask if colder else 0, admit=not lossless)
            if not self.is_current(rec) or not rec.tiers & slot.bit:
                return True  # removed or replaced meanwhile: its room is free already
            if rec.pinned:
                return False  # pinned meanwhile: it stays (and keeps its new colder copy)
            if lossless and not demoted and not colder:
                return False
        self.drop_copy(slot, rec)
        slot.counters.evictions += 1
        self.emit(EventKind.EVICTED, rec, slot, detail)
        self.lose_if_empty(rec, "evicted; no colder tier took it")
        return True

    def admits(self, rec: BlockRecord, source: TierSlot, target: TierSlot) -> bool:
        """Whether *target* takes *rec* on its way down from *source* when *source*'s
        policy evicts it: the one admission decision, made by *target*'s policy
        (``EvictionPolicy.admit``: Dynamo-style gating of SSD writes by what the colder
        tier reads back). A refused block tries the next colder tier, and is dropped
        when none takes it. Flushes and operator requests do not ask (they must keep
        every block)."""
        idle = max(self.clock() - rec.accessed, 0.0)
        return bool(target.policy.admit(rec.name, rec.parent, hits=rec.hits, idle=idle))

    def demotion_targets(self, rec: BlockRecord, source: TierSlot, *, admit: bool = True) -> Iterator[TierSlot]:
        """The colder tiers that may take *rec* leaving *source*, in order; *admit*: ask
        each one's admission policy (:meth:`admits`)."""
        for target in self.slots[source.index + 1 :]:
            if target.usable() and (not admit or self.admits(rec, source, target)):
                yield target

    def demote(self, slot: TierSlot, rec: BlockRecord, *, skip: int = 0, admit: bool = True) -> Flow[bool]:
        """Copy the block from *slot* into the first colder tier that takes it (not the
        tiers in the mask *skip*; *admit*: only tiers whose admission policy accepts it).
        A flow: the lock is let go for the read and the write."""
        rec.moving |= slot.bit
        slot.policy.remove(rec.name)  # not a victim candidate while it moves
        try:
            ref = yield from self.open_copy(slot, rec)
            if ref is None:
                log.warning("cannot demote %s from %s: its copy is not readable", rec.name, slot.name)
                return False
            with ref:
                for target in self.demotion_targets(rec, slot, admit=admit):
                    if not skip & target.bit and (yield from self.copy_into(target, rec, ref.data, EventKind.DEMOTED)):
                        return True
            return False
        finally:
            rec.moving &= ~slot.bit
            if self.is_current(rec) and rec.tiers & slot.bit and not rec.pinned and rec.name not in slot.policy:
                self.policy_insert(slot, rec)  # it stays here after all: a candidate again

    # -- placing a copy ---------------------------------------------------------------

    def copy_into(
        self,
        slot: TierSlot,
        rec: BlockRecord,
        data: Any,
        kind: EventKind,
        detail: str = "",
        *,
        new: bool = False,
        lossless: bool = False,
    ) -> Flow[bool]:
        """Put *data* (the block's bytes, valid until this returns) into *slot* for *rec*.

        A flow (:meth:`drive`). A volatile tier is written under the lock; a persistent
        one in a step (:class:`CopyWrite`): reserve (evicting by policy), write with the
        lock let go, complete. False
        when the tier cannot take it now (unavailable, too small, full of pinned blocks,
        the name busy there). *new*: *rec* is a block being sealed, not yet in the catalog.
        *lossless*: no block loses its last copy to make the room. A copy written under a
        name its block no longer has (renamed meanwhile) is deleted, not committed: False.
        """
        name = rec.name
        if slot.is_busy(name) or not slot.usable():  # health last: a half-open probe must call it
            return False
        if slot.persistent:
            self.require_io(slot.index, "writing a copy")
        fp = self.footprint(slot, rec)
        ns = self.namespaces.of(name) if self.namespaces else None
        if not (yield from self.make_room(slot, fp, lossless=lossless, ns=ns)):
            return False
        if not new and not self.is_current(rec):
            return False  # deleted or replaced while room was made
        if rec.tiers & slot.bit:
            return True  # another reader promoted it meanwhile
        if not slot.persistent:
            if not (yield from self._put_volatile(slot, rec, data, lossless)):
                return False
        elif not (yield from self._put_persistent(slot, rec, data, fp, ns, new=new, lossless=lossless)):
            return False
        self._added(slot, rec, kind, detail)
        return True

    def _added(self, slot: TierSlot, rec: BlockRecord, kind: EventKind, detail: str = "") -> None:
        """Record *slot*'s new copy of *rec*: the catalog, the counters, the event."""
        self.add_copy(slot, rec)
        if slot.shared:
            rec.checked = self.clock()  # just written there: no need to ask again soon
        c = slot.counters
        c.bytes_written += rec.size
        if kind is EventKind.STORED:
            c.stored += 1
        elif kind is EventKind.PROMOTED:
            c.promotions += 1
        elif kind is EventKind.DEMOTED:
            c.demotions += 1
        self.emit(kind, rec, slot, detail)

    # -- extents a client writes (kvfs.ingest) ------------------------------------------

    def reserve_extent(self, slot: TierSlot, name: str, size: int) -> Flow[int | None]:
        """Room for a block of *size* bytes that a client writes itself into *slot* (a
        reservable volatile tier): evict by policy until it fits (within its namespace's
        quota there, as any placement), then take a free extent no reader sees. Its
        footprint counts in ``slot.reserved`` (and the namespace's) until
        :meth:`commit_extent` or :meth:`abort_extent`. Returns the extent's offset, or
        None when it cannot fit (full of pinned or busy blocks). A flow (demotions let go
        of the lock)."""
        fp = slot.footprint(name, size)
        ns = self.namespaces.of(name) if self.namespaces else None
        for _ in range(_TIER_FULL_RETRIES):
            if not slot.usable() or not (yield from self.make_room(slot, fp, ns=ns)):
                return None
            try:
                offset = slot.tier.reserve(size)
            except TierFull:  # fragmented: evict more
                if not (yield from self._evict_one(slot, False)):
                    return None
                continue
            self._hold_reserved(slot, name, fp, +1)
            return offset
        return None

    def _hold_reserved(self, slot: TierSlot, name: str, fp: int, sign: int) -> None:
        slot.reserved += sign * fp
        ns = self.namespaces.of(name) if self.namespaces else None
        if ns is not None:
            ns.reserved[slot.index] += sign * fp

    def commit_extent(self, slot: TierSlot, rec: BlockRecord, offset: int, detail: str = "written by a client") -> None:
        """Publish the extent reserved at *offset* as the new block *rec*'s copy in *slot*
        (under the lock; the caller verified the bytes against ``rec.checksum``)."""
        self._hold_reserved(slot, rec.name, slot.footprint(rec.name, rec.size), -1)
        slot.tier.commit(rec.name, offset, rec.size, rec.checksum)
        self._added(slot, rec, EventKind.STORED, detail)

    def abort_extent(self, slot: TierSlot, name: str, size: int, offset: int) -> None:
        """Give back an extent reserved at *offset* that will not be published (under the lock)."""
        self._hold_reserved(slot, name, slot.footprint(name, size), -1)
        slot.tier.abort(offset, size)

    def _put_volatile(self, slot: TierSlot, rec: BlockRecord, data: Any, lossless: bool) -> Flow[bool]:
        for _ in range(_TIER_FULL_RETRIES):
            try:
                slot.tier.put(rec.name, data, rec.checksum)
                return True
            except TierFull:  # fragmented: evict more
                if not (yield from self._evict_one(slot, lossless)):
                    return False
        return False

    def _evict_one(self, slot: TierSlot, lossless: bool) -> Flow[bool]:
        """Evict the policy's next victim from *slot* (a tier fuller than its count says)."""
        skipped: list[str] = []
        victim = self.victim(slot, skipped)
        self._restore(slot, skipped)
        return victim is not None and (yield from self.evict_copy(slot, victim, lossless=lossless))

    def _put_persistent(
        self,
        slot: TierSlot,
        rec: BlockRecord,
        data: Any,
        fp: int,
        ns: NamespaceState | None,
        *,
        new: bool,
        lossless: bool,
    ) -> Flow[bool]:
        for _ in range(_TIER_FULL_RETRIES):
            step = CopyWrite(self, slot, rec, data, fp, ns, new=new)
            yield step  # written where the lock is not held (drive)
            written = step.complete()
            if written is Written.COMMITTED:
                return True
            if written is not Written.FULL or not (yield from self._evict_one(slot, lossless)):
                return False  # FULL: fuller than the count says; evict and try again
        return False

    def refusal(self, slot: TierSlot, rec: BlockRecord) -> str:
        """Why *slot* did not take *rec* just now (for messages)."""
        if not slot.usable():
            return "is unavailable"
        if slot.is_busy(rec.name):
            return "is busy with an earlier copy of it"
        ns = self.namespaces.of(rec.name) if self.namespaces else None
        if ns is not None and self.ns_over(ns, slot, self.footprint(slot, rec)):
            return f"holds namespace {ns.path!r} at its quota there"
        cap = slot.capacity
        if cap is not None and self.footprint(slot, rec) > cap:
            return "is too small for it"
        return "is full (of pinned or busy blocks)"

    def no_space(self, rec: BlockRecord) -> NoSpace:
        """The error for a new block *rec* no tier takes now, each tier's reason named
        (counted as a refusal of its namespace when that has quotas). Under the lock."""
        ns = self.namespaces.of(rec.name) if self.namespaces else None
        if ns is not None and any(q is not None for q in ns.quota):
            ns.refused += 1
            return NoSpace(
                f"no tier can take {rec.name!r} ({rec.size} bytes) within namespace {ns.path!r}'s quotas: "
                + "; ".join(f"{s.name} {self.refusal(s, rec)}" for s in self.slots)
                + "; unpin blocks of it or raise its quota (kvfs quota set)"
            )
        return NoSpace(
            f"no tier can take {rec.name!r} ({rec.size} bytes): every tier is full of pinned blocks "
            "or too small; unpin blocks or add capacity"
        )

    def place(self, rec: BlockRecord, data: Any) -> Flow[TierSlot | None]:
        """Seal the new block *rec* into the hottest tier that takes it (a flow)."""
        for slot in self.slots:
            if (yield from self.copy_into(slot, rec, data, EventKind.STORED, new=True)):
                return slot
        return None

    def promote(self, rec: BlockRecord, data: Any, below: int) -> Flow[None]:
        """Copy a block just read from tier *below* into the hottest tier that takes it (a flow)."""
        if not self.is_current(rec):
            return
        for slot in self.slots[:below]:
            if rec.tiers & slot.bit:
                return
            if (yield from self.copy_into(slot, rec, data, EventKind.PROMOTED)):
                return


def _open_in(tier: Tier, name: str) -> BlockRef:
    return tier.open(name)


def _unpack_ref(ref: BlockRef) -> tuple[memoryview, int]:
    return ref.data, ref.checksum
