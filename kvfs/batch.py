"""Batch reads for readers outside the store: which of many names are present, and
leases on their copies — the store side of the batch client's ``lookup`` and ``get``.

:meth:`BatchReads.probe` answers for a thousand names under one acquisition of the
store's lock, without touching a tier. :meth:`BatchReads.lease` leases one local copy per
name for a reader that copies the bytes itself (a DRAM extent, a disk block file),
counting the read as a hit; a block whose hottest local copy is in a persistent tier is
first copied into DRAM when the caller asks (:data:`PROMOTE_ALWAYS`) or when the store's
``[policy] promote`` would promote on this read (:data:`PROMOTE_POLICY`), and a block
only shared tiers hold is always fetched into a local tier first (a client cannot read S3
or NFS through a lease). Promotions are two-phase moves like any other and run in the
caller's thread; inside ``Store.nowait`` they raise :class:`~kvfs.errors.StoreBusy` before
anything changed, so the caller repeats the call from a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from .errors import InvalidName, KvfsError
from .leases import Lease
from .names import normalize

if TYPE_CHECKING:
    from .store import Store

__all__ = ["PROMOTE_ALWAYS", "PROMOTE_NEVER", "PROMOTE_POLICY", "BatchReads", "Presence"]

PROMOTE_POLICY = "policy"
PROMOTE_ALWAYS = "always"
PROMOTE_NEVER = "never"


class Presence(NamedTuple):
    """What :meth:`BatchReads.probe` says of a present block: payload *size*, the tiers
    holding a copy as a bitmask over the store's tiers (bit 0 = hottest), *pinned*."""

    size: int
    tiers: int
    pinned: bool


class BatchReads:
    """Probes and leases many names of *store* at once (see the module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.placement = store.placement
        self.catalog = store.catalog

    def _names(self, names: Sequence[str]) -> list[str | InvalidName]:
        """Each name normalized (a name the catalog holds already is), or why it cannot be."""
        blocks = self.catalog.blocks
        out: list[str | InvalidName] = []
        for n in names:
            if n in blocks:  # a racy read, only to skip normalize() for names that are fine
                out.append(n)
                continue
            try:
                out.append(normalize(n))
            except InvalidName as exc:
                out.append(exc)
        return out

    def _refresh(self, names: Sequence[str | InvalidName]) -> None:
        if self.store.shared:
            for n in names:
                if isinstance(n, str):
                    self.store.records.refresh(n)

    def probe(self, names: Sequence[str]) -> list[Presence | None]:
        """Per name: its :class:`Presence`, or None when there is no such block. Raises
        :class:`InvalidName` for a name that is not a valid kvfs path."""
        normalized = self._names(names)
        for n in normalized:
            if isinstance(n, InvalidName):
                raise n
        self._refresh(normalized)
        get = self.catalog.blocks.get
        out: list[Presence | None] = []
        with self.placement.locked():
            for n in normalized:
                rec = get(n)  # type: ignore[arg-type]
                out.append(None if rec is None or not rec.tiers else Presence(rec.size, rec.tiers, rec.pinned))
        return out

    def lease(
        self, names: Sequence[str], *, ttl: float, promote: str = PROMOTE_POLICY, count_hits: bool = True
    ) -> list[Lease | KvfsError]:
        """Per name: a :class:`Lease` on its hottest local copy (after promoting it per
        *promote*), or the error that name met (:class:`~kvfs.errors.BlockNotFound`, …)."""
        if promote not in (PROMOTE_POLICY, PROMOTE_ALWAYS, PROMOTE_NEVER):
            raise ValueError(f"promote must be one of policy, always, never (got {promote!r})")
        normalized = self._names(names)
        self._refresh(normalized)
        for name in self._to_promote(normalized, promote):
            try:
                self.store.prefetch(name)
            except KvfsError:
                pass  # not promoted (DRAM full of pinned blocks, gone meanwhile): lease what is there
        out: list[Lease | KvfsError] = []
        leases = self.store.leases
        with self.placement.locked():
            for n in normalized:
                if isinstance(n, InvalidName):
                    out.append(n)
                    continue
                try:
                    lease = leases.take(n, ttl=ttl)
                except KvfsError as exc:
                    out.append(exc)
                    continue
                rec = self.catalog.get(n)
                if count_hits and rec is not None:
                    self.store.count_read(rec, lease.slot)
                out.append(lease)
        return out

    def _to_promote(self, names: Sequence[str | InvalidName], promote: str) -> list[str]:
        """The names to copy into a hotter tier before leasing; inside ``Store.nowait``
        :class:`~kvfs.errors.StoreBusy` when there are any (nothing changed yet)."""
        p = self.placement
        slots = self.store.slots
        hot = slots[0]
        out: list[str] = []
        source = 0  # the tier whose I/O the first promotion needs
        with p.locked():
            for n in names:
                rec = self.catalog.get(n) if isinstance(n, str) else None
                if rec is None:
                    continue
                local = rec.tiers & p.local_mask
                if not local:
                    if not out:
                        source = (rec.tiers & -rec.tiers).bit_length() - 1
                    out.append(rec.name)  # only shared tiers hold it: fetch it into a local one
                    continue
                first = slots[(local & -local).bit_length() - 1]
                if not first.persistent or hot.persistent or promote == PROMOTE_NEVER:
                    continue
                if promote == PROMOTE_ALWAYS or self.store.should_promote(rec, extra_hit=True):
                    if not out:
                        source = first.index
                    out.append(rec.name)
            if out and p.waiting_forbidden:
                p.require_io(source, f"promoting {out[0]!r} before leasing it")
        return out
