"""Copies down: the write-through queue and the flush before unmount.

A tier configured ``write = "through"`` gets a copy of every block sealed above it soon
after: ``put`` queues the work and the owner (the daemon's nursery) calls
:meth:`WriteBack.run_pending` from a worker thread; the copy runs outside the store's
lock against room reserved beforehand. :meth:`WriteBack.flush` writes every block that is
only in volatile tiers down to the first persistent tier, so a clean unmount loses
nothing. A mixin of :class:`kvfs.store.Store`.
"""

from __future__ import annotations

import logging

from .errors import BlockCorrupt, BlockNotFound, TierFull, TierUnavailable
from .events import EventKind

__all__ = ["WriteBack"]

log = logging.getLogger("kvfs.store")


class WriteBack:
    """Write-through copies and the flush (see the module doc)."""

    def _open_hottest(self, rec, why: str):
        """The hottest copy of *rec* to copy down from, or None (logged) when it cannot be
        read; the read path deals with the bad copy when a reader next asks."""
        try:
            return self.tiers[next(rec.tier_indexes())].open(rec.name)
        except (BlockNotFound, BlockCorrupt, TierUnavailable) as exc:
            log.warning("%s of %s skipped: cannot read it: %s", why, rec.name, exc)
            return None

    def run_pending(self, limit: int | None = None) -> int:
        """Copy up to *limit* queued blocks down to their write-through tiers; returns how
        many were copied. Safe to call from a worker thread while the store serves: the
        copy itself (an upload to S3, a write to NFS) runs outside the lock, against room
        reserved in the target tier beforehand. A copy that fails is queued again."""
        done = 0
        while limit is None or done < limit:
            with self._lock:
                if not self._pending:
                    break
                rec, j = self._pending.popleft()
                if self.catalog.get(rec.name) is not rec or rec.tiers & (1 << j) or not rec.tiers:
                    continue
                if not self._usable(j):
                    self._pending.append((rec, j))  # keep it for when the tier answers
                    break
                fp = self._footprint(j, rec)
                if not self._make_room(j, fp):
                    log.warning("write-through of %s skipped: tier %s cannot make room", rec.name, self.tiers[j].name)
                    continue
                ref = self._open_hottest(rec, "write-through")
                if ref is None:
                    continue
                self.catalog.count_in(j, fp)  # reserve the room while the copy runs
            error: Exception | None = None
            with ref:
                try:
                    self.tiers[j].put(rec.name, ref.data, rec.checksum)
                except (TierUnavailable, TierFull) as exc:
                    error = exc
            with self._lock:
                self.catalog.count_out(j, fp)
                if error is not None:
                    if isinstance(error, TierUnavailable):
                        self._mark_unhealthy(j, error)
                    self._pending.append((rec, j))
                    break
                self._mark_healthy(j)
                current = self.catalog.get(rec.name)
                if current is rec and not rec.tiers & (1 << j):
                    self._add_copy(j, rec)
                    self._counters[j].bytes_written += rec.size
                    self._counters[j].demotions += 1
                    self._emit(EventKind.DEMOTED, rec, j, "write-through")
                    done += 1
                    continue
                orphan = current is None
            if orphan:  # deleted while it was being copied: do not leave it behind
                try:
                    self.tiers[j].delete(rec.name)
                except TierUnavailable as exc:
                    log.warning("could not remove orphan copy of %s from %s: %s", rec.name, self.tiers[j].name, exc)
        return done

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> int:
        """Run every pending write-through, then write each block whose only copies are in
        volatile tiers (DRAM) down to the first persistent tier that takes it. Returns the
        number of blocks written down. Called before unmount: a clean unmount loses nothing."""
        self.run_pending()
        written = 0
        with self._lock:
            volatile = [r for r in self.catalog.blocks.values() if r.tiers and not r.tiers & self._persistent_mask]
            for rec in volatile:
                src = next(rec.tier_indexes())
                ref = self._open_hottest(rec, "flush")
                if ref is None:
                    continue
                with ref:
                    for j in range(src + 1, len(self.tiers)):
                        if self.tiers[j].persistent and self._place(j, rec, ref.data, EventKind.DEMOTED):
                            written += 1
                            break
                    else:
                        log.error("flush: no persistent tier took %s", rec.name)
        return written
