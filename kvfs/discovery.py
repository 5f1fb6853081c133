"""How the store learns what shared tiers hold (posix, s3): discovery, revalidation, listings.

Shared tiers are what other nodes write too, so the catalog is never complete for them:
a name this node does not know is looked up in them (stat, i.e. a HEAD for s3) and a miss
is remembered for ``negative_ttl`` seconds; a known block held by a shared tier is
re-checked after the same TTL, so a block deleted on another node reads as missing here
soon after; directory listings merge the shared tiers' own listings, cached for
``listing_ttl`` seconds (docs/shared-tiers.md).

A mixin of :class:`kvfs.store.Store`: it uses the store's catalog, lock and tier health,
and is not meant to be used alone.
"""

from __future__ import annotations

import logging

from .catalog import BlockRecord
from .errors import KvfsError, TierUnavailable
from .events import EventKind

__all__ = ["SharedTierDiscovery"]

log = logging.getLogger("kvfs.store")


class SharedTierDiscovery:
    """Discovery and revalidation against the store's shared tiers (see the module doc)."""

    def _ask_shared(self, call) -> tuple[list[tuple[int, object]], bool]:
        """``call(tier)`` on every usable shared tier, outside the lock. Returns the tiers'
        answers that are not None, and whether every shared tier answered; a tier that
        fails is marked unhealthy."""
        answers = []
        complete = True
        for i in self._shared:
            if not self._usable(i):
                complete = False
                continue
            try:
                answer = call(self.tiers[i])
            except TierUnavailable as exc:
                with self._lock:
                    self._mark_unhealthy(i, exc)
                complete = False
                continue
            with self._lock:
                self._mark_healthy(i)
            if answer is not None:
                answers.append((i, answer))
        return answers, complete

    def _stat_shared(self, name: str) -> tuple[list[tuple[int, object]], bool]:
        """Stat *name* in every usable shared tier: the tiers holding it with their
        answers, and whether every shared tier answered."""
        return self._ask_shared(lambda tier: tier.stat(name))

    def _refresh(self, name: str) -> None:
        """Bring the record of *name* in line with the shared tiers, when it is due.

        Unknown here and not known missing: stat the shared tiers and create a record
        holding the tiers that have it (this is how a block written on another node
        appears), or remember the miss for ``negative_ttl``. Known and held by a shared
        tier, last confirmed more than ``negative_ttl`` ago: stat again; gone from every
        shared tier means another node deleted it, so this node's copies go too. A tier
        that does not answer changes nothing (local copies keep serving).
        """
        if not self._shared:
            return
        now = self._clock()
        with self._lock:
            if self.catalog.is_dir(name):
                return
            rec = self.catalog.get(name)
            if rec is None:
                if self._negative.get(name, 0.0) > now:
                    return
            elif not rec.tiers & self._shared_mask or now - rec.checked < self.negative_ttl:
                return
        found, complete = self._stat_shared(name)
        with self._lock:
            if self.catalog.get(name) is not rec:
                return  # written or deleted here meanwhile: the local answer is newer
            if found:
                first = found[0][1]
                if rec is not None and (rec.size, rec.checksum) == (first.size, first.checksum):
                    rec.checked = now
                    for i, info in found:
                        if (info.size, info.checksum) == (rec.size, rec.checksum) and not rec.tiers & (1 << i):
                            self._add_copy(i, rec)
                    return
                if rec is not None:  # replaced on another node: our copies are stale
                    self._discard_stale(rec, "replaced on another node")
                new = BlockRecord(name, first.size, first.checksum, created=now, accessed=now, checked=now)
                try:
                    self.catalog.add(new)
                except KvfsError as exc:  # e.g. a local directory of that name
                    log.warning("block %s in a shared tier is hidden here: %s", name, exc)
                    return
                for i, info in found:
                    if (info.size, info.checksum) == (first.size, first.checksum):
                        self._add_copy(i, new)
                self._negative.pop(name, None)
                return
            if not complete:
                return  # some shared tier did not answer: neither "gone" nor "missing" is known
            if rec is not None:
                self._discard_stale(rec, "deleted on another node")
            self._negative[name] = now + self.negative_ttl
            if len(self._negative) > 100_000:  # bound the memory of misses
                self._negative = {k: t for k, t in self._negative.items() if t > now}

    def _discard_stale(self, rec: BlockRecord, why: str) -> None:
        """Drop a record: delete this node's local copies, forget the shared ones. For a
        block another node removed or replaced (whose shared copies must never be deleted
        from here), and for ``delete``, which removes the shared copies itself, outside
        the lock. Under the lock."""
        for i in list(rec.tier_indexes()):
            if self.tiers[i].shared:
                self._forget_copy(i, rec)
            else:
                self._drop_copy(i, rec)
        self.catalog.discard(rec)
        self._emit(EventKind.REMOVED, rec, detail=why)

    def _shared_listing(self, directory: str) -> dict[str, bool]:
        """What the shared tiers hold directly in *directory*, merged; cached for
        ``listing_ttl`` seconds so listing a large namespace does not list S3 each time."""
        now = self._clock()
        with self._lock:
            hit = self._listings.get(directory)
            if hit is not None and hit[0] > now:
                return hit[1]
        merged: dict[str, bool] = {}
        listings, complete = self._ask_shared(lambda tier: tier.listdir(directory))
        for _, listing in listings:
            for base, is_dir in listing.items():
                merged[base] = merged.get(base, False) or is_dir
        with self._lock:
            # a partial answer (a tier down) is cached briefly, so it is retried soon
            self._listings[directory] = (now + (self.listing_ttl if complete else min(1.0, self.listing_ttl)), merged)
            if len(self._listings) > 10_000:
                self._listings = {k: v for k, v in self._listings.items() if v[0] > now}
        return merged
