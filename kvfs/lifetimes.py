"""Lifetimes: soft pins that expire, and the retention of namespaces.

:class:`Lifetimes` is the store's collaborator for both, driven by the store's clock
(a fake one in tests) and run by the store's owner: the daemon's background task calls
``Store.sweep()`` every 0.2 s, which calls :meth:`Lifetimes.sweep`.

- A **soft pin** (``kvfs pin --for 10m``, ``user.kvfs.pinned = "10m"``) pins a block
  like a pin until its expiry, then unpins it: it becomes an eviction candidate again.
  Expiries wait in a heap; a sweep pops those due, O(log n) each, and nothing else.
- **Retention**: a namespace with ``retention`` removes every block whose last access
  (read or write, on this node) is older than that from every tier this node writes to.
  Local copies go at once; a shared tier's copy is deleted only if it, too, was written
  before the cutoff (``Tier.expire``): a block another node published again within the
  retention stays there. Pinned blocks (hard or soft) are kept. The sweep walks the
  namespace's blocks in batches of :data:`BATCH`, letting go of the store's lock between
  batches, at most every ``retention / 20`` (1 s to 60 s).
- A **retired** namespace (its model's KV is stale) takes no new blocks, and the sweep
  drops this node's copies of its blocks; ``kvfs gc`` removes it from shared tiers.

A block's last access is known since this daemon started: one found on disk at start
counts from then, so a restart never makes anything expire early.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from .catalog import BlockRecord, Catalog
from .namespaces import Namespaces, NamespaceState
from .placement import Placement
from .revalidation import SharedRecords
from .shared import SharedView
from .units import format_duration

__all__ = ["BATCH", "Lifetimes", "SweepReport"]

log = logging.getLogger("kvfs.store")

BATCH = 512  # records examined per hold of the store's lock in a retention sweep
_MIN_INTERVAL = 1.0
_MAX_INTERVAL = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepReport:
    """What one :meth:`Lifetimes.sweep` did."""

    unpinned: int = 0
    """Soft pins that expired."""
    expired: int = 0
    """Blocks removed because they outlived their namespace's retention."""
    retired: int = 0
    """Blocks of retired namespaces whose local copies were dropped."""


class Lifetimes:
    """Soft-pin expiries and retention sweeps over the blocks *placement* keeps (see the
    module doc): *namespaces* have the retentions, *records* drops a block's record and
    local copies, *shared* the shared tiers whose copies expire too; *clock* is the
    store's."""

    def __init__(
        self,
        placement: Placement,
        catalog: Catalog,
        namespaces: Namespaces,
        records: SharedRecords,
        shared: SharedView,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.placement = placement
        self.catalog = catalog
        self.namespaces = namespaces
        self.records = records
        self.shared = shared
        self.clock = clock
        self._due: list[tuple[float, int, BlockRecord]] = []  # (expiry, seq, record): a heap
        self._seq = itertools.count()
        self._next_retention = float("-inf")

    # -- soft pins (under the store's lock) -------------------------------------------

    def pinned(self, rec: BlockRecord, ttl: float | None) -> None:
        """*rec* was just pinned (or unpinned): until ``now + ttl`` (a soft pin), or with
        no expiry (``ttl`` None: a pin, or an unpin)."""
        if ttl is None or not rec.pinned:
            rec.pin_expires = 0.0
            return
        until = self.clock() + ttl
        rec.pin_expires = until
        heapq.heappush(self._due, (until, next(self._seq), rec))

    def _unpin_due(self, now: float) -> int:
        if not self._due or self._due[0][0] > now:  # read without the lock: at worst a sweep late
            return 0
        p = self.placement
        n = 0
        with p.locked():
            while self._due and self._due[0][0] <= now:
                until, _, rec = heapq.heappop(self._due)
                # a later pin (soft or hard), an unpin or a new version since: not this expiry
                if p.is_current(rec) and rec.pinned and rec.pin_expires == until:
                    p.set_pinned(rec, False)
                    rec.pin_expires = 0.0
                    n += 1
        return n

    # -- sweeps (from the owner's background task) ------------------------------------

    def reschedule(self) -> None:
        """Run a retention pass at the next sweep (a retention changed)."""
        self._next_retention = float("-inf")

    def due(self) -> bool:
        """Whether :meth:`sweep` has work now: a soft pin expired or a retention pass is
        due (reads without the lock: at worst a sweep runs one pass late)."""
        now = self.clock()
        return bool(self._due and self._due[0][0] <= now) or now >= self._next_retention

    def sweep(self) -> SweepReport:
        """Unpin the soft pins that expired; when one is due, run a retention pass over
        every namespace with a retention or retired."""
        now = self.clock()
        unpinned = self._unpin_due(now)
        if now < self._next_retention:
            return SweepReport(unpinned=unpinned)
        spaces = [ns for ns in self.namespaces if ns.retention is not None or ns.retired]
        self._next_retention = now + self._interval(spaces)
        expired = retired = 0
        for ns in spaces:
            n = self._sweep_namespace(ns, now)
            if ns.retired:
                retired += n
            else:
                expired += n
        return SweepReport(unpinned=unpinned, expired=expired, retired=retired)

    @staticmethod
    def _interval(spaces: list[NamespaceState]) -> float:
        shortest = min((ns.retention for ns in spaces if ns.retention is not None), default=_MAX_INTERVAL * 20)
        return min(max(shortest / 20, _MIN_INTERVAL), _MAX_INTERVAL)

    def _sweep_namespace(self, ns: NamespaceState, now: float) -> int:
        p = self.placement
        with p.locked():
            recs = list(self.catalog.under(ns.path))
        if ns.retired:
            cutoff, why = float("inf"), f"namespace {ns.path} is retired"
        else:
            assert ns.retention is not None
            cutoff, why = now - ns.retention, f"not read for {format_duration(ns.retention)} (retention of {ns.path})"
        removed = 0
        for start in range(0, len(recs), BATCH):
            with p.locked():  # deletes of local files run when it is let go, after each batch
                for rec in recs[start : start + BATCH]:
                    if rec.pinned or rec.accessed >= cutoff or not p.is_current(rec):
                        continue
                    self._remove(rec, None if ns.retired else cutoff, why)
                    removed += 1
                    ns.expired += 1
        if removed:
            log.info("%s: %d blocks removed (%s)", ns.path, removed, why)
        return removed

    def _remove(self, rec: BlockRecord, cutoff: float | None, why: str) -> None:
        """Under the lock: drop this node's copies of *rec*; with *cutoff*, also the shared
        tiers' copies written before it (in the background, like an unlink's deletes)."""
        self.records.drop_record(rec, why)
        if cutoff is None:
            return
        for slot in self.shared.slots:
            self.placement.delete_copy(slot, rec.name, cutoff=cutoff)
        self.shared.remember_missing(rec.name)
