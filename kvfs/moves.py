"""Moves of bytes in a tier as explicit two-phase steps: prepare, I/O, complete.

Each step is the unit of tier I/O the store does with its lock let go, in the style of
vLLM's offloading manager (``prepare_store`` → transfer → ``complete_store(success)``):

1. ``prepare`` (under the store's lock) is the step's constructor: it takes what the I/O
   needs kept still (holds on the names, room reserved in the tier and in the namespace's
   quota) and records what it saw: the block's record, its name, its checksum and size,
   the tier;
2. ``run`` does the tier I/O with the lock **not held** by this thread (it raises
   :class:`RuntimeError` when it is: the step is called from the wrong place), and keeps
   the tier's answer or error; it never touches the catalog;
3. ``complete`` (under the lock again) is the one place that asks what changed meanwhile
   (is the record still the block's, was it renamed, deleted or replaced) and commits or
   undoes: it gives back the holds and the reservations, deletes a file left under a name
   nobody claims, forgets a copy that is gone. ``abort`` (under the lock) undoes a step
   whose I/O did not finish (an unexpected error): holds and reservations back, nothing
   committed.

The steps take the parts they use (a :class:`Keeper`, the slot, the record), never the
store. :class:`~kvfs.placement.Placement` is the keeper. The work a store call does under
the lock is a :data:`Flow`: a generator that ``yield``s each prepared step where its I/O
goes (and ``yield from``s the flows it calls); ``Placement.drive``, at the top of the
store call, runs it under the lock and runs each step's I/O after the ``with`` scope of
the lock has ended, so the lock is never let go under a caller. :mod:`kvfs.renames` runs
its step the same way by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from .backlog import DeleteJob
from .catalog import BlockRecord
from .errors import BlockCorrupt, BlockNotFound, DescriptorsExhausted, TierFull, TierUnavailable
from .namespaces import NamespaceState
from .slot import TierSlot
from .tier import BackingFile, BlockRef, Tier

__all__ = ["CopyDelete", "CopyRead", "CopyRenames", "CopyWrite", "Flow", "Keeper", "Phase", "Step", "Written"]

T = TypeVar("T")


class Keeper(Protocol):
    """What a step needs of the placement that owns the lock and the copies' bookkeeping
    (:class:`kvfs.placement.Placement`); every method but :attr:`holds_lock` is called
    under the lock."""

    @property
    def holds_lock(self) -> bool:
        """True when this thread holds the store's lock."""
        ...

    def is_current(self, rec: BlockRecord) -> bool: ...

    def release_hold(self, slot: TierSlot, name: str) -> None: ...

    def forget_copy(self, slot: TierSlot, rec: BlockRecord, *, policy: bool = True) -> None: ...

    def delete_copy(self, slot: TierSlot, name: str, *, cutoff: float | None = None) -> None: ...

    def corrupt(self, slot: TierSlot, rec: BlockRecord, why: str) -> None: ...


class Step(Protocol):
    """A prepared step: its I/O phase (with the lock let go) and its undo (under the lock)."""

    def run(self) -> None: ...

    def abort(self) -> None: ...


Flow = Generator[Step, None, T]
"""A store call's work under the lock that yields the steps whose I/O runs with it let go:
``Placement.drive`` runs it (``yield step`` where the I/O goes; ``yield from`` a flow)."""


class Phase(enum.Enum):
    """Where a step is: prepared (holds taken), ran (I/O done, answer kept), ended
    (completed or aborted: holds given back)."""

    PREPARED = "prepared"
    RAN = "ran"
    ENDED = "ended"


class _Step:
    """The phases' order, and the rule that the I/O phase runs with the lock let go."""

    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper
        self.phase = Phase.PREPARED

    def _start_io(self) -> None:
        if self.phase is not Phase.PREPARED:
            raise RuntimeError(f"{type(self).__name__}: the I/O phase runs once, after prepare ({self.phase.value})")
        if self.keeper.holds_lock:
            raise RuntimeError(
                f"{type(self).__name__}: tier I/O with the store's lock held; run a step's I/O where "
                "no enclosing call holds the lock (at the top of the store call)"
            )

    def _end(self) -> None:
        if self.phase is Phase.ENDED:
            raise RuntimeError(f"{type(self).__name__}: completed or aborted already")
        self.phase = Phase.ENDED


class CopyRead(_Step, Generic[T]):
    """Read the copy of *rec* in the persistent *slot* with ``fetch(tier, name)``,
    verified against what the record said at prepare; *unpack* turns the result into
    ``(payload view, checksum)``. The step holds nothing: a copy that changes while read
    fails its checksum or goes missing, and :meth:`complete` tells that from a bad copy.
    Constructed under the lock (prepare): it records what the read will check its bytes
    against."""

    def __init__(
        self,
        keeper: Keeper,
        slot: TierSlot,
        rec: BlockRecord,
        fetch: Callable[[Tier, str], T],
        unpack: Callable[[T], Any],
    ) -> None:
        super().__init__(keeper)
        self.slot = slot
        self.rec = rec
        self.name = rec.name
        self.checksum = rec.checksum
        self.size = rec.size
        self.fetch = fetch
        self.unpack = unpack
        self.result: T | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        """With the lock let go: read the copy, keeping the result or the tier's error."""
        self._start_io()
        try:
            self.result = self.fetch(self.slot.tier, self.name)
        except (BlockNotFound, BlockCorrupt, TierUnavailable) as exc:
            self.error = exc
        self.phase = Phase.RAN

    def complete(self) -> T | None:
        """Under the lock: the verified result, or None when there is no good copy there
        now (a vanished or bad copy is dropped from the record; a copy renamed or replaced
        while read is neither). :class:`DescriptorsExhausted` is raised: the daemon's
        limit, not the copy's or the tier's, fails this read alone."""
        self._end()
        keeper, slot, rec, error = self.keeper, self.slot, self.rec, self.error
        if isinstance(error, DescriptorsExhausted):
            raise error
        # renamed while read (or being renamed: moving, both names held): a missing file,
        # or a header already naming the new name, says nothing about the copy; bytes
        # that were read are still the block's. (A demotion sets moving but holds nothing.)
        renamed = rec.name != self.name or bool(rec.moving & slot.bit and slot.is_busy(self.name))
        if isinstance(error, (BlockNotFound, BlockCorrupt)) and renamed:
            return None
        if isinstance(error, BlockNotFound):
            if keeper.is_current(rec) and not slot.is_busy(rec.name):  # busy: being renamed or rewritten
                keeper.forget_copy(slot, rec)  # vanished (another node deleted it)
            return None
        if isinstance(error, BlockCorrupt):
            keeper.corrupt(slot, rec, str(error))
            return None
        if isinstance(error, TierUnavailable):
            slot.failed(error)
            return None
        result = self.result
        assert result is not None
        data, csum = self.unpack(result)
        if csum != rec.checksum or len(data) != rec.size:
            _release(result)
            if not keeper.is_current(rec) or slot.is_busy(rec.name):
                return None  # a replace racing this read is not corruption
            if slot.shared:
                # The copy verified against its own header, so another node replaced the
                # block: not corruption, and never delete it; re-check on next lookup.
                keeper.forget_copy(slot, rec)
                rec.checked = 0.0
                return None
            keeper.corrupt(slot, rec, "copy does not match the block's checksum")
            return None
        slot.answered()
        return result

    def abort(self) -> None:
        """Under the lock: give back what was read (the read did not finish or is not wanted)."""
        self._end()
        if self.result is not None:
            _release(self.result)
            self.result = None


class Written(enum.Enum):
    """What a :class:`CopyWrite` came to."""

    COMMITTED = "committed"
    """The tier holds the copy, under the record's name: the caller adds it to the record."""
    STALE = "stale"
    """Written, but the record was deleted, replaced or renamed meanwhile: the file is deleted."""
    FULL = "full"
    """The tier was fuller than its count said: evict and try again."""
    FAILED = "failed"
    """The tier did not answer (counted against its health)."""


class CopyWrite(_Step):
    """Write *data* as *rec*'s copy into the persistent *slot*: *fp* bytes of room are
    reserved in the slot (and in the namespace *ns*'s quota) and the name is held busy
    (never a victim, never overwritten or deleted) from prepare to complete. *new*: *rec*
    is a block being sealed, not yet in the catalog. Constructed under the lock (prepare):
    it reserves the room and holds the name (*data*: the bytes, valid until the step ends)."""

    def __init__(
        self,
        keeper: Keeper,
        slot: TierSlot,
        rec: BlockRecord,
        data: Any,
        fp: int,
        ns: NamespaceState | None,
        *,
        new: bool,
    ) -> None:
        super().__init__(keeper)
        self.slot = slot
        self.rec = rec
        self.data = data
        self.name = rec.name
        self.checksum = rec.checksum
        self.fp = fp
        self.ns = ns
        self.new = new
        self.error: Exception | None = None
        self._reserve(+1)
        slot.hold(self.name)

    def _reserve(self, sign: int) -> None:
        self.slot.reserved += sign * self.fp
        if self.ns is not None:
            self.ns.reserved[self.slot.index] += sign * self.fp

    def run(self) -> None:
        """With the lock let go: write the bytes."""
        self._start_io()
        try:
            self.slot.tier.put(self.name, self.data, self.checksum)
        except (TierFull, TierUnavailable) as exc:
            self.error = exc
        self.phase = Phase.RAN

    def complete(self) -> Written:
        """Under the lock: give back the reservation and the hold, and say what the write
        came to. A copy written for a record that is no longer the block's under this name
        (deleted, replaced or renamed meanwhile) is nobody's: it is deleted, never left
        behind (a record claiming it would send every reader, here and on other nodes,
        to a name this tier does not hold)."""
        self._end()
        slot, name, error = self.slot, self.name, self.error
        self._reserve(-1)
        if error is None:
            slot.doomed.discard(name)  # the file a waiting delete meant is replaced
        self.keeper.release_hold(slot, name)
        if isinstance(error, TierUnavailable):
            slot.failed(error)
            return Written.FAILED
        if error is not None:
            return Written.FULL
        slot.answered()
        if self.new or (self.rec.name == name and self.keeper.is_current(self.rec)):
            return Written.COMMITTED
        self.keeper.delete_copy(slot, name)
        return Written.STALE

    def abort(self) -> None:
        """Under the lock: the write did not finish (an unexpected error). The reservation
        and the hold are given back; what it may have left is not committed, and a waiting
        delete of the name still runs."""
        self._end()
        self._reserve(-1)
        self.keeper.release_hold(self.slot, self.name)


class CopyRenames(_Step):
    """Rename *rec*'s copies in the persistent tiers *slots* from *old* to *new*: both
    names held busy and the tiers marked moving in the record from prepare to complete.
    Constructed under the lock (prepare): it holds both names in every tier of *slots* and
    marks them moving."""

    def __init__(self, keeper: Keeper, rec: BlockRecord, old: str, new: str, slots: list[TierSlot]) -> None:
        super().__init__(keeper)
        self.rec = rec
        self.old = old
        self.new = new
        self.slots = slots
        self.mask = 0
        for slot in slots:
            self.mask |= slot.bit
        self.errors: dict[int, Exception] = {}
        for slot in slots:
            slot.hold(old)
            slot.hold(new)
        rec.moving |= self.mask

    def run(self) -> None:
        """With the lock let go: rename each copy, keeping each tier's error."""
        self._start_io()
        for slot in self.slots:
            try:
                slot.tier.rename(self.old, self.new)
            except (BlockNotFound, BlockCorrupt, TierUnavailable) as exc:
                self.errors[slot.index] = exc
        self.phase = Phase.RAN

    def _release(self) -> None:
        self.rec.moving &= ~self.mask
        for slot in self.slots:
            self.keeper.release_hold(slot, self.old)
            self.keeper.release_hold(slot, self.new)

    def complete(self) -> list[TierSlot]:
        """Under the lock: the tiers where the copy now has the new name. A tier that
        failed forgets the copy (when the record is still the block's); its failure is
        counted against its health."""
        self._end()
        for slot in self.slots:
            if slot.index not in self.errors:
                slot.doomed.discard(self.new)  # the file a waiting delete meant is replaced
        self._release()
        for slot in self.slots:
            err = self.errors.get(slot.index)
            if err is None:
                continue
            if isinstance(err, TierUnavailable):
                slot.failed(err)
            if self.keeper.is_current(self.rec):
                self.keeper.forget_copy(slot, self.rec)
        return [s for s in self.slots if s.index not in self.errors]

    def abort(self) -> None:
        """Under the lock: the renames did not finish (an unexpected error); holds given back."""
        self._end()
        self._release()


class CopyDelete(_Step):
    """Delete the copy named by *job* from the shared *slot* (its name held busy since the
    job was queued): a delete, or with a cutoff the retention sweep's expire. Constructed
    under the lock (prepare) with *job* taken from the queue (its name is held already)."""

    def __init__(self, keeper: Keeper, slot: TierSlot, job: DeleteJob) -> None:
        super().__init__(keeper)
        self.slot = slot
        self.job = job
        self.error: TierUnavailable | None = None

    def run(self) -> None:
        """With the lock let go: delete (or expire) the file."""
        self._start_io()
        job = self.job
        try:
            if job.cutoff is None:
                self.slot.tier.delete(job.name)
            else:  # the retention sweep's: never a copy another node wrote since the cutoff
                self.slot.tier.expire(job.name, job.cutoff)
        except TierUnavailable as exc:
            self.error = exc
        self.phase = Phase.RAN

    def complete(self) -> bool:
        """Under the lock: True when deleted (the hold on the name ends); False when the
        tier did not answer: the job keeps its hold, and the caller queues it again."""
        self._end()
        if self.error is not None:
            self.slot.failed(self.error)
            return False
        self.slot.answered()
        self.keeper.release_hold(self.slot, self.job.name)
        return True

    def abort(self) -> None:
        """Under the lock: the delete did not finish; the job keeps its hold (queue it again)."""
        self._end()


def _release(result: object) -> None:
    if isinstance(result, (BlockRef, BackingFile)):
        result.release()
