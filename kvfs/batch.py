"""Batch reads for readers outside the store: which of many names are present, and
leases on their copies — the store side of the batch client's ``lookup`` and ``get``.

:meth:`BatchReads.probe` answers for a thousand names under one acquisition of the
store's lock, without touching a tier (a name unknown here is looked up in the shared
tiers first, as any lookup does). :meth:`BatchReads.lease` leases one local copy per
name for a reader that copies the bytes itself (a DRAM extent, a disk block file),
counting the read as a hit; a block whose hottest local copy is in a persistent tier is
first copied into DRAM when the caller asks (:attr:`Promote.ALWAYS <kvfs.promotion.Promote.ALWAYS>`) or when the store's
``[policy] promote`` would promote on this read (:attr:`Promote.POLICY <kvfs.promotion.Promote.POLICY>`), and a block
only shared tiers hold is always fetched into a local tier first (a client cannot read S3
or NFS through a lease). Promotions are two-phase moves like any other and run in the
caller's thread; inside ``Store.nowait`` they raise :class:`~kvfs.errors.StoreBusy` before
anything changed, so the caller repeats the call from a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .catalog import Catalog
from .errors import InvalidName, KvfsError
from .leases import Lease, Leases
from .names import normalize
from .peers import Elsewhere
from .placement import Placement
from .promotion import Promote
from .reading import Reading
from .steering import OperatorCommands

__all__ = ["BatchReads", "Probe"]


@dataclass(frozen=True, slots=True)
class Probe:
    """What :meth:`BatchReads.probe` says of many names, per name in order: payload
    ``sizes`` (-1: no such block), the tiers holding a copy as bitmasks over the store's
    tiers (bit 0 = hottest), ``pinned``; ``prefix``: how many leading names are all
    present (the cached length of a chain)."""

    sizes: list[int]
    tiers: list[int]
    pinned: list[bool]
    prefix: int


class BatchReads:
    """Probes and leases many names of the blocks *placement* keeps at once (see the
    module doc): *elsewhere* learns of names other nodes hold, *leases* hands out the
    copies, *reading* counts the reads and says what to promote, *operator* promotes."""

    def __init__(
        self,
        placement: Placement,
        catalog: Catalog,
        elsewhere: Elsewhere,
        leases: Leases,
        reading: Reading,
        operator: OperatorCommands,
    ) -> None:
        self.placement = placement
        self.catalog = catalog
        self.elsewhere = elsewhere
        self.leases = leases
        self.reading = reading
        self.operator = operator

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
        if self.elsewhere.active:
            for n in names:
                if isinstance(n, str):
                    self.elsewhere.refresh(n)

    def probe(self, names: Sequence[str]) -> Probe:
        """Presence of every name (see :class:`Probe`), under one acquisition of the lock.
        Raises :class:`InvalidName` for a name that is not a valid kvfs path."""
        blocks = self.catalog.blocks
        if self.elsewhere.active:
            self._refresh([n if n in blocks else normalize(n) for n in names])
        with self.placement.locked():
            get = blocks.get
            recs = [get(n) for n in names]
            if None in recs:  # a miss may be a name written another way ("/a//b"): normalize those
                recs = [r if r is not None else get(normalize(n)) for n, r in zip(names, recs, strict=True)]
            sizes = [-1 if r is None else r.size for r in recs]
            tiers = [0 if r is None else r.tiers for r in recs]
            pinned = [False if r is None else r.pinned for r in recs]
        try:
            prefix = sizes.index(-1)
        except ValueError:
            prefix = len(sizes)
        return Probe(sizes=sizes, tiers=tiers, pinned=pinned, prefix=prefix)

    def lease(
        self, names: Sequence[str], *, ttl: float, promote: str = Promote.POLICY, count_hits: bool = True
    ) -> list[Lease | KvfsError]:
        """Per name: a :class:`Lease` on its hottest local copy (after promoting it per
        *promote*), or the error that name met (:class:`~kvfs.errors.BlockNotFound`, …)."""
        if promote not in Promote.ALL:
            raise ValueError(f"promote must be one of {', '.join(Promote.ALL)} (got {promote!r})")
        normalized = self._names(names)
        self._refresh(normalized)
        for name in self._to_promote(normalized, promote):
            try:
                self.operator.prefetch(name)
            except KvfsError:
                pass  # not promoted (DRAM full of pinned blocks, gone meanwhile): lease what is there
        valid = [n for n in normalized if isinstance(n, str)]
        counted = self.reading.count_reads if count_hits else None
        taken = self.leases.take_many(valid, ttl=ttl, counted=counted)
        if len(valid) == len(normalized):
            return taken
        it = iter(taken)
        return [n if isinstance(n, InvalidName) else next(it) for n in normalized]

    def _to_promote(self, names: Sequence[str | InvalidName], promote: str) -> list[str]:
        """The names to copy into a hotter tier before leasing; inside ``Store.nowait``
        :class:`~kvfs.errors.StoreBusy` when there are any (nothing changed yet)."""
        p = self.placement
        slots = self.placement.slots
        hot = slots[0]
        out: list[str] = []
        source = 0  # the tier whose I/O the first promotion needs
        in_hot = hot.bit if hot.bit & p.local_mask and not hot.persistent else 0  # copies that stay where they are
        get = self.catalog.blocks.get
        with p.locked():
            for n in names:
                rec = get(n) if isinstance(n, str) else None
                if rec is None or rec.tiers & in_hot:
                    continue
                local = rec.tiers & p.local_mask
                if not local:
                    if not out:
                        source = (rec.tiers & -rec.tiers).bit_length() - 1
                    out.append(rec.name)  # only shared tiers hold it: fetch it into a local one
                    continue
                first = slots[(local & -local).bit_length() - 1]
                if not first.persistent or hot.persistent or promote == Promote.NEVER:
                    continue
                if promote == Promote.ALWAYS or self.reading.should_promote(rec, extra_hit=True):
                    if not out:
                        source = first.index
                    out.append(rec.name)
            if out and p.waiting_forbidden:
                p.require_io(source, f"promoting {out[0]!r} before leasing it")
        return out
