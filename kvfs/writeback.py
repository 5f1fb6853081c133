"""Copies down: running the write-through queue, and the flush before unmount.

A tier configured ``write = "through"`` gets a copy of every block sealed above it soon
after: ``put`` queues the work (:mod:`kvfs.backlog`) and the owner (the daemon's nursery)
calls :meth:`WriteBack.run_pending` from a worker thread. Each copy is a two-phase move
(:meth:`~kvfs.placement.Placement.copy_into`): room reserved, bytes copied outside the
store's lock, committed. Deletes queued for shared tiers run here too.

:meth:`WriteBack.flush` writes every block that is only in volatile tiers (DRAM) down to
the first persistent tier that takes it, so a clean unmount loses nothing, and says what
it could not do in a :class:`FlushReport`: blocks no persistent tier took (lost when the
process ends), write-through copies not made (the block is persistent elsewhere) and
deletes that did not reach a shared tier. A tier that fails during the flush is not
tried again by it, so a hung tier costs the flush one deadline, not one per block.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .backlog import CopyJob, DeleteJob, WriteThroughQueue
from .catalog import BlockRecord
from .events import EventKind
from .moves import CopyDelete, Flow
from .placement import Placement
from .slot import TierSlot

__all__ = ["FlushReport", "WriteBack"]

log = logging.getLogger("kvfs.store")


class _Outcome(enum.Enum):
    """What one queued job came to: done, skipped (nothing to do), or stop (the tier is
    down or the lock is busy: the rest waits for the next run)."""

    DONE = "done"
    SKIPPED = "skipped"
    STOP = "stop"


@dataclass(frozen=True, kw_only=True, slots=True)
class FlushReport:
    """What :meth:`WriteBack.flush` did and could not do."""

    written: int = 0
    """Blocks only in DRAM that were written to a persistent tier."""
    lost: tuple[tuple[str, str], ...] = ()
    """``(name, why)`` of blocks only in DRAM that no persistent tier took."""
    unsynced: dict[str, int] = field(default_factory=dict)
    """tier -> write-through copies not made (those blocks are held by another tier)."""
    undeleted: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """tier -> names whose delete never reached that shared tier."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when nothing only in DRAM is lost."""
        return not self.lost

    def to_json(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "lost": [{"name": n, "why": w} for n, w in self.lost],
            "unsynced": dict(self.unsynced),
            "undeleted": {t: list(ns) for t, ns in self.undeleted.items()},
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FlushReport:
        return cls(
            written=int(obj.get("written", 0)),
            lost=tuple((str(e["name"]), str(e["why"])) for e in obj.get("lost", ())),
            unsynced={str(k): int(v) for k, v in obj.get("unsynced", {}).items()},
            undeleted={str(k): tuple(v) for k, v in obj.get("undeleted", {}).items()},
            seconds=float(obj.get("seconds", 0.0)),
        )


class WriteBack:
    """Runs *queue*'s jobs and the flush through *placement* (see the module doc)."""

    def __init__(self, placement: Placement, queue: WriteThroughQueue) -> None:
        self.placement = placement
        self.queue = queue

    def run_pending(self, limit: int | None = None, *, skip: frozenset[int] = frozenset()) -> int:
        """Run up to *limit* queued copies and deletes; returns how many were done. Safe
        to call from a worker thread while the store serves. A tier that does not answer
        keeps its jobs (and its turn) for the next call; other tiers go on."""
        done = 0
        with self.placement.locked():
            tiers = self.queue.tiers()
        for t in tiers:
            if t in skip:
                continue
            slot = self.placement.slots[t]
            with self.placement.locked():
                n = self.queue.pending(t)
            for _ in range(n):
                if limit is not None and done >= limit:
                    return done
                outcome = self._run_one(slot)
                if outcome is _Outcome.DONE:
                    done += 1
                elif outcome is _Outcome.STOP:
                    break
        return done

    def _run_one(self, slot: TierSlot) -> _Outcome:
        return self.placement.drive(self._one(slot))

    def _one(self, slot: TierSlot) -> Flow[_Outcome]:
        if not self.queue.pending(slot.index) or not slot.usable():
            return _Outcome.STOP
        job = self.queue.pop(slot.index)
        if job is None:
            return _Outcome.STOP
        if isinstance(job, DeleteJob):
            return (yield from self._delete(slot, job))
        return (yield from self._copy(slot, job))

    def run_delete(self, slot: TierSlot, name: str) -> bool:
        """Run the queued delete of *name* from *slot* now, if it is still queued (from a
        limiter's thread, so the caller of ``delete`` need not wait); True if it ran."""
        return self.placement.drive(self._run_delete(slot, name))

    def _run_delete(self, slot: TierSlot, name: str) -> Flow[bool]:
        job = self.queue.take_delete(slot.index, name)
        if job is None:
            return False
        # asked only now: a thread that takes a half-open tier's probe must call the tier
        if not slot.usable():
            self.queue.push_back(job)
            return False
        return (yield from self._delete(slot, job)) is _Outcome.DONE

    def _delete(self, slot: TierSlot, job: DeleteJob) -> Flow[_Outcome]:
        """Delete what *job* names (taken from the queue; the name is held in *slot* since
        the job was queued) in a step, with the lock let go; a tier that did not answer
        gets the job back (it keeps its turn)."""
        step = CopyDelete(self.placement, slot, job)
        try:
            yield step
        except BaseException:
            self.queue.push_back(job)
            raise
        if step.complete():
            return _Outcome.DONE
        self.queue.push_back(job)
        return _Outcome.STOP

    def _copy(self, slot: TierSlot, job: CopyJob) -> Flow[_Outcome]:
        """A flow: the copy is read and written in steps with the lock let go."""
        p = self.placement
        rec = job.rec
        if not p.is_current(rec) or rec.tiers & slot.bit or not rec.tiers:
            return _Outcome.SKIPPED
        if slot.is_busy(rec.name):
            self.queue.copy(rec, slot.index)  # a delete of the old name runs first
            return _Outcome.SKIPPED
        name = rec.name
        ref = yield from p.open_copy(p.slots[next(rec.tier_indexes())], rec)
        if ref is None:
            if p.is_current(rec) and rec.tiers and (rec.name != name or rec.moving):
                self.queue.copy(rec, slot.index)  # renamed while read: copy it under its new name
                return _Outcome.SKIPPED
            log.warning("write-through of %s skipped: cannot read it", rec.name)
            return _Outcome.SKIPPED
        with ref:
            if (yield from p.copy_into(slot, rec, ref.data, EventKind.DEMOTED, "write-through")):
                return _Outcome.DONE
        if p.is_current(rec) and rec.name != name and not rec.tiers & slot.bit:
            self.queue.copy(rec, slot.index)  # renamed while written: the copy is made under its new name
            return _Outcome.SKIPPED
        if not slot.usable():
            self.queue.push_back(job)  # keep it for when the tier answers
            return _Outcome.STOP
        if slot.is_busy(rec.name):
            self.queue.copy(rec, slot.index)
            return _Outcome.SKIPPED
        if p.is_current(rec) and not rec.tiers & slot.bit:
            log.warning("write-through of %s skipped: tier %s cannot make room", rec.name, slot.name)
        return _Outcome.SKIPPED

    @property
    def pending(self) -> int:
        return len(self.queue)

    # -- the flush -------------------------------------------------------------------

    def flush(self) -> FlushReport:
        """Run the pending write-through work, then write each block whose only copies are
        in volatile tiers down to the first persistent tier that takes it. Called before
        unmount: a clean unmount loses nothing, and what it could not save is reported."""
        t0 = time.monotonic()
        p = self.placement
        failed: set[int] = set()
        self._run_until_failure(failed)
        with p.locked():
            volatile = [r for r in p.catalog.blocks.values() if r.tiers and not r.tiers & p.persistent_mask]
        written = 0
        lost: list[tuple[str, str]] = []
        for rec in volatile:
            why = self._save(rec, failed)
            if why is None:
                written += 1
            elif why:
                lost.append((rec.name, why))
        self._run_until_failure(failed)  # deletes and copies queued by the flush itself
        with p.locked():
            unsynced: dict[str, int] = {}
            undeleted: dict[str, tuple[str, ...]] = {}
            for t in self.queue.tiers():
                name = p.slots[t].name
                jobs = list(self.queue.jobs(t))
                copies = sum(1 for j in jobs if isinstance(j, CopyJob) and p.is_current(j.rec))
                deletes = tuple(j.name for j in jobs if isinstance(j, DeleteJob))
                if copies:
                    unsynced[name] = copies
                if deletes:
                    undeleted[name] = deletes
        for name, why in lost:
            log.error("unmount: %s was only in DRAM and is lost: %s", name, why)
        return FlushReport(
            written=written, lost=tuple(lost), unsynced=unsynced, undeleted=undeleted, seconds=time.monotonic() - t0
        )

    def _run_until_failure(self, failed: set[int]) -> None:
        """Run the queued jobs until none is left or a pass gets none done; a tier that
        fails is added to *failed* and not tried again by this flush."""
        while True:
            with self.placement.locked():
                before = len(self.queue)
                tiers = [t for t in self.queue.tiers() if t not in failed]
            if not tiers:
                return
            for t in tiers:
                slot = self.placement.slots[t]
                for _ in range(self.queue.pending(t)):
                    if self._run_one(slot) is _Outcome.STOP:
                        if self.queue.pending(t):
                            failed.add(t)
                        break
            if len(self.queue) >= before:
                return  # only jobs that wait for something else (a lease, a busy name) left

    def _save(self, rec: BlockRecord, failed: set[int]) -> str | None:
        """Write *rec* down; None when written, "" when there is nothing to do, else why not."""
        return self.placement.drive(self._save_flow(rec, failed))

    def _save_flow(self, rec: BlockRecord, failed: set[int]) -> Flow[str | None]:
        p = self.placement
        if not p.is_current(rec) or rec.tiers & p.persistent_mask or not rec.tiers:
            return ""
        src = p.slots[next(rec.tier_indexes())]
        ref = yield from p.open_copy(src, rec)
        if ref is None:
            return "its DRAM copy cannot be read"
        reasons: list[str] = []
        with ref:
            for slot in p.slots[src.index + 1 :]:
                if not slot.persistent:
                    continue
                if slot.index in failed:
                    reasons.append(f"{slot.name} is unavailable")
                    continue
                if (yield from p.copy_into(slot, rec, ref.data, EventKind.DEMOTED, "flush", lossless=True)):
                    return None
                if not p.is_current(rec):
                    return ""
                reasons.append(f"{slot.name} {p.refusal(slot, rec)}")
                if not slot.usable():
                    failed.add(slot.index)
        return "; ".join(reasons) or "no persistent tier is configured"
