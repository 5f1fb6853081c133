"""What operators ask of the store through the tools: pin, prefetch, evict, du, fsck.

A mixin of :class:`kvfs.store.Store` (``kvfs pin/prefetch/evict/du/fsck`` reach these
through the daemon's control socket).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .blockfile import checksum as compute_checksum
from .errors import BlockCorrupt, BlockNotFound, KvfsError, NoSpace, TierUnavailable
from .events import EventKind
from .names import normalize

__all__ = ["LastCopy", "StoreSteering", "Usage"]

if TYPE_CHECKING:
    from .store import BlockStat

log = logging.getLogger("kvfs.store")


class LastCopy(KvfsError):
    """Raised by :meth:`Store.evict` when dropping the copy would lose the block and no
    colder tier can take it; pass ``force=True`` to drop it anyway."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """What the blocks at or under one path take: per tier ``(name, used bytes, blocks)``
    hottest first (bytes as counted against the tier's capacity), and in total the number
    of distinct blocks and their payload bytes."""

    tiers: tuple[tuple[str, int, int], ...]
    blocks: int
    size: int


class StoreSteering:
    """Pin, prefetch, evict, usage and verify (see the module doc)."""

    def pin(self, name: str, pinned: bool = True) -> BlockStat:
        """Pin (or unpin) a block: a pinned block is never evicted from the tiers it is in."""
        name = normalize(name)
        self._refresh(name)
        with self._lock:
            rec = self.catalog.require(name)
            if pinned and not rec.pinned:
                for i in rec.tier_indexes():
                    self._policies[i].remove(rec.name)
            elif not pinned and rec.pinned:
                for i in rec.tier_indexes():
                    self._policy_insert(i, rec)
            rec.pinned = pinned
            return self._stat(rec)

    def prefetch(self, name: str, tier: str | None = None) -> BlockStat:
        """Copy the block into *tier* (the hottest by default) now. Raises :class:`NoSpace`
        if the tier cannot make room, :class:`BlockNotFound` if no copy is readable."""
        name = normalize(name)
        k = 0 if tier is None else self.tier_index(tier)
        self._refresh(name)
        with self._lock:
            rec = self.catalog.require(name)
            if rec.tiers & (1 << k):
                self._policies[k].touch(rec.name)
                return self._stat(rec)
        with self.open(name, count_hit=False) as ref, self._lock:
            if self.catalog.get(name) is not rec:
                raise BlockNotFound(name)
            if not rec.tiers & (1 << k) and not self._place(k, rec, ref.data, EventKind.PROMOTED):
                raise NoSpace(f"tier {self.tiers[k].name!r} cannot make room for {name!r}")
            return self._stat(rec)

    def evict(self, name: str, tier: str | None = None, *, force: bool = False) -> BlockStat | None:
        """Drop the block's copies in *tier*, or in every local (non-shared) tier.

        A copy that is the block's last is first demoted to a colder tier; when none takes
        it, :class:`LastCopy` is raised unless *force*, which drops it (the block is gone
        and ``None`` is returned).
        """
        name = normalize(name)
        with self._lock:
            rec = self.catalog.require(name)
            if tier is None:
                targets = [i for i in rec.tier_indexes() if not self.tiers[i].shared]
            else:
                k = self.tier_index(tier)
                targets = [k] if rec.tiers & (1 << k) else []
            dropping = sum(1 << i for i in targets)
            for i in targets:
                if not rec.tiers & ~dropping:
                    saved = False
                    try:
                        ref = self.tiers[i].open(rec.name)
                    except (BlockNotFound, BlockCorrupt, TierUnavailable):
                        ref = None
                    if ref is not None:
                        with ref:
                            saved = any(
                                self._place(j, rec, ref.data, EventKind.DEMOTED)
                                for j in range(i + 1, len(self.tiers))
                                if not dropping & (1 << j)
                            )
                    if not saved and not force:
                        raise LastCopy(
                            f"{name!r}: the copy in {self.tiers[i].name!r} is the last one and no colder tier "
                            "took it; use --force to drop it"
                        )
                self._drop_copy(i, rec)
                self._counters[i].evictions += 1
                self._emit(EventKind.EVICTED, rec, i, "by request")
            self._lose_if_empty(rec, "evicted by request")
            return self._stat(rec) if rec.tiers else None

    # -- inspection (kvfs du, kvfs fsck) ------------------------------------------

    def usage(self, directory: str = "") -> Usage:
        """Bytes and blocks per tier at or under *directory* (a block name counts itself).

        From the catalog's running totals per directory: a dictionary lookup, however
        many blocks lie below, and no tier I/O.
        """
        directory = normalize(directory)
        with self._lock:
            rec = self.catalog.get(directory)
            if rec is not None:
                per_tier = [
                    (self._footprint(i, rec), 1) if rec.tiers >> i & 1 else (0, 0) for i in range(len(self.tiers))
                ]
                blocks, size = 1, rec.size
            elif self.catalog.is_dir(directory):
                t = self.catalog.totals.get(directory)
                n = len(self.tiers)
                per_tier = list(zip(t.used, t.copies)) if t else [(0, 0)] * n
                blocks, size = (t.blocks, t.size) if t else (0, 0)
            else:
                raise BlockNotFound(directory)
            return Usage(
                tiers=tuple((tier.name, used, count) for tier, (used, count) in zip(self.tiers, per_tier)),
                blocks=blocks,
                size=size,
            )

    def verify(self, name: str, *, repair: bool = False) -> dict[str, str | None]:
        """Read every copy of block *name* and check it against the block's size and
        checksum; returns ``{tier name: None if good, else why it is bad}``, hottest first.

        Without *repair* nothing changes (fsck reports). With *repair* a bad copy is
        dropped, counted and reported as a ``corrupt`` event exactly like a bad copy found
        by a read; a block left with no copy is removed. A copy in an unavailable tier is
        reported (``"tier unavailable: …"``) and never dropped. Copies that move while
        being checked (evicted, replaced) are skipped. :class:`BlockNotFound` if absent.
        """
        name = normalize(name)
        with self._lock:
            rec = self.catalog.require(name)
            order = list(rec.tier_indexes())
        out: dict[str, str | None] = {}
        for i in order:
            tier = self.tiers[i]
            why: str | None = None
            try:
                ref = tier.open(rec.name)
            except BlockNotFound:
                why = "the copy is missing"
            except BlockCorrupt as exc:
                why = str(exc) or "the copy is corrupt"
            except TierUnavailable as exc:
                out[tier.name] = f"tier unavailable: {exc}"
                continue
            else:
                with ref:
                    if len(ref.data) != rec.size:
                        why = f"the copy has {len(ref.data)} bytes, the block {rec.size}"
                    elif compute_checksum(ref.data) != rec.checksum:
                        why = "the copy does not match the block's checksum"
            with self._lock:
                if self.catalog.get(rec.name) is not rec or not rec.tiers & (1 << i):
                    continue  # moved or replaced meanwhile: not this copy's fault
            out[tier.name] = why
            if why is not None and repair:
                self._corrupt(i, rec, why)
        if repair:
            with self._lock:
                self._lose_if_empty(rec, "no good copy left")
        return out
