"""Keeping records in line with the shared tiers: discovery, revalidation, shared deletes.

:class:`SharedRecords` is the store's collaborator that turns what the shared tiers say
(:class:`~kvfs.shared.SharedView`) into catalog changes (docs/shared-tiers.md):

- a name this node does not know is **discovered**: asked of the shared tiers in the
  caller's thread (a local miss; bounded by their deadlines), and a record is made for the
  tiers that hold it, or the miss is remembered;
- a known block held by a shared tier (or found on disk at start and not yet checked) is
  **revalidated** when it is used more than ``negative_ttl`` after its last check: in the
  background, never making local work wait (a caller may wait ``shared_wait`` for it);
  gone from every shared tier means another node deleted it, another version means it
  was replaced there;
- **deletes** queued for the shared tiers are started in their limiters right away.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from .backlog import WriteThroughQueue
from .catalog import BlockRecord
from .errors import KvfsError
from .events import EventKind
from .names import is_reserved
from .placement import Placement
from .shared import SharedAnswer, SharedView
from .writeback import WriteBack

__all__ = ["SharedRecords"]

log = logging.getLogger("kvfs.store")


class SharedRecords:
    """Records of *placement*'s catalog kept in line with *shared* (see the module doc);
    *writeback* runs the queued shared deletes; *shared_wait* seconds is the longest a
    caller waits for background work it started."""

    def __init__(
        self,
        placement: Placement,
        shared: SharedView,
        queue: WriteThroughQueue,
        writeback: WriteBack,
        *,
        clock: Callable[[], float],
        shared_wait: float = 0.0,
    ) -> None:
        self.placement = placement
        self.catalog = placement.catalog
        self.shared = shared
        self.queue = queue
        self.writeback = writeback
        self.clock = clock
        self.shared_wait = shared_wait
        indexes = [s.index for s in shared.slots]
        self.ask_tier = indexes[-1] if indexes else None
        """The tier whose limiter a question to the shared tiers runs under."""

    def due(self, rec: BlockRecord) -> bool:
        """Whether the shared tiers should confirm *rec* again."""
        if not (rec.tiers & self.shared.mask or rec.learn_shared):
            return False
        return self.clock() - rec.checked >= self.shared.negative_ttl

    def revalidate_later(self, rec: BlockRecord) -> threading.Event | None:
        """Start the check of *rec* in the background (never waits); its answer is applied
        when it arrives. None when none was started (one in flight, or no tier usable)."""
        return self.shared.stat_later(rec.name, functools.partial(self._revalidated, rec))

    def refresh(self, name: str) -> None:
        """Bring the record of *name* in line with the shared tiers, when it is due.

        Unknown here and not known missing: discover it now, in this thread. Known and
        due: revalidate it in the background and answer from what is known, waiting at
        most ``shared_wait``. Raises :class:`~kvfs.errors.StoreBusy` inside
        ``Store.nowait`` when the tiers must be asked now.
        """
        if not self.shared or is_reserved(name):  # a reserved name is another writer's temporary there
            return
        p = self.placement
        with p.locked():
            if self.catalog.is_dir(name):
                return
            rec = self.catalog.get(name)
            if rec is None:
                if self.shared.known_missing(name) or self.queue.deleting(name):
                    return
                assert self.ask_tier is not None
                p.require_io(self.ask_tier, "asking the shared tiers")
                pending = None
            else:
                if not self.due(rec):
                    return
                pending = self.revalidate_later(rec)
                if pending is None or p.waiting_forbidden or self.shared_wait <= 0:
                    return
        if pending is None:
            self.discover(name)
        else:
            pending.wait(self.shared_wait)

    def discover(self, name: str) -> bool:
        """Ask the shared tiers for *name* now (outside the lock) and record what they
        hold; True when a record with copies exists afterwards."""
        answer = self.shared.stat(name)
        with self.placement.locked():
            rec = self.catalog.get(name)
            if rec is not None:
                return bool(rec.tiers)  # written or found here meanwhile: the local answer is newer
            if self.catalog.is_dir(name) or self.queue.deleting(name):
                return False
            self.apply(name, None, answer)
            rec = self.catalog.get(name)
            return rec is not None and bool(rec.tiers)

    def _revalidated(self, rec: BlockRecord, name: str, answer: SharedAnswer) -> None:
        """The background answer for *rec* arrived (in a limiter's thread)."""
        with self.placement.locked():
            if self.catalog.get(name) is rec:
                self.apply(name, rec, answer)

    def apply(self, name: str, rec: BlockRecord | None, answer: SharedAnswer) -> None:
        """Bring the record of *name* (*rec*, None if unknown) in line with *answer*.
        Under the lock."""
        p = self.placement
        now = self.clock()
        if rec is not None and rec.moving:
            return  # being renamed or moved right now: ask again later
        # A tier where this node is writing, deleting or renaming the name right now says
        # nothing about other nodes: its answer does not count, and the answer is partial.
        busy = [slot for slot in self.shared.slots if slot.is_busy(name)]
        found = [(slot, info) for slot, info in answer.found if slot not in busy]
        complete = answer.complete and not busy
        if found:
            first = found[0][1]
            same = [slot for slot, info in found if (info.size, info.checksum) == (first.size, first.checksum)]
            if rec is not None and (rec.size, rec.checksum) == (first.size, first.checksum):
                rec.checked = now
                rec.learn_shared = False
                for slot in same:
                    if not rec.tiers & slot.bit:
                        p.add_copy(slot, rec)
                return
            if rec is not None:
                if not rec.tiers & self.shared.mask:
                    # found here at start, another version shared: keep ours, never guess
                    rec.checked = now
                    rec.learn_shared = False
                    return
                self.drop_record(rec, "replaced on another node")
            new = BlockRecord(name, first.size, first.checksum, created=now, accessed=now, checked=now)
            try:
                self.catalog.add(new)
            except KvfsError as exc:  # e.g. a local directory of that name
                log.warning("block %s in a shared tier is hidden here: %s", name, exc)
                return
            for slot in same:
                p.add_copy(slot, new)
            self.shared.forget_missing(name)
            return
        if not complete:
            return  # some shared tier did not answer: neither "gone" nor "missing" is known
        if rec is not None:
            if not rec.tiers & self.shared.mask:
                rec.checked = now  # a local block the shared tiers never had
                rec.learn_shared = False
                return
            self.drop_record(rec, "deleted on another node")
        self.shared.remember_missing(name)

    def drop_record(self, rec: BlockRecord, why: str) -> None:
        """Remove a record: delete this node's local copies, forget the shared ones (a
        block another node removed or replaced, whose shared copies must never be deleted
        from here; ``Store.delete`` queues those deletes itself). Under the lock."""
        p = self.placement
        for i in list(rec.tier_indexes()):
            slot = p.slots[i]
            if slot.shared:
                p.forget_copy(slot, rec)
            else:
                p.drop_copy(slot, rec)
        self.catalog.discard(rec)
        p.emit(EventKind.REMOVED, rec, detail=why)

    def run_deletes(self, name: str, *, wait: bool) -> None:
        """Start the queued deletes of *name* on the shared tiers in their limiters;
        wait for them at most ``shared_wait`` when *wait*."""
        done: list[threading.Event] = []
        for slot in self.shared.slots:
            # run_delete asks the tier's health in the limiter's thread, the one that calls
            # it: asked here, a half-open tier's probe would go to a thread that never does
            if slot.limiter is not None:
                job = slot.limiter.submit(self.writeback.run_delete, slot, name, on_done=_ignore)
                if job is not None:
                    done.append(job.finished)
        if wait and self.shared_wait > 0:
            deadline = time.monotonic() + self.shared_wait
            for ev in done:
                ev.wait(max(0.0, deadline - time.monotonic()))


def _ignore(_job: object) -> None:
    """A background call whose outcome the caller does not need (it records its own)."""
