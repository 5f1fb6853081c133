"""Sealing blocks: :meth:`Store.put`, and the two steps every way of writing a block shares.

:class:`Sealing` is the store's collaborator for writes. Every new version of a block is
sealed the same way, whether its bytes came through :meth:`Sealing.put` (the mount, the
socket's ``put``), a reserved extent a client filled (:mod:`kvfs.ingest`) or a peer
(:meth:`kvfs.ingest.Ingest.adopt`):

1. :meth:`Sealing.check_writable`, before anything: the name may be written (not in a
   retired namespace, no component reserved for kvfs's own files);
2. :meth:`Sealing.seal_begin`, under the lock: the current record (its directories made
   for a new name), before the new version's first copy is placed;
3. the first copy is placed (:meth:`kvfs.placement.Placement.place`, a kept promise, or a
   committed extent);
4. :meth:`Sealing.seal_end`, under the lock: the new record replaces the old version, whose
   other copies are dropped, and is queued for the write-through tiers below.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .backlog import WriteThroughQueue
from .blockfile import checksum as compute_checksum
from .catalog import BlockRecord, BlockStat, Catalog
from .config import WriteMode
from .errors import IsADirectory, NamespaceRetired
from .moves import Flow
from .names import check_creatable, normalize, parent_of
from .namespaces import Namespaces
from .pieces import Pieces
from .placement import Placement
from .promises import Promise, Promises
from .shared import SharedView
from .slot import TierSlot

__all__ = ["Sealing"]


class Sealing:
    """Writes of new block versions into the tiers of *placement* (see the module doc).
    *namespaces* say which names are writable; *shared* forgets a name's absence once it
    is written; *queue* takes the copies for the write-through tiers; *clock* stamps the
    records. It keeps the store's :class:`~kvfs.promises.Promises` (``promises``)."""

    def __init__(
        self,
        placement: Placement,
        catalog: Catalog,
        namespaces: Namespaces,
        shared: SharedView,
        queue: WriteThroughQueue,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.placement = placement
        self.catalog = catalog
        self.slots = placement.slots
        self.namespaces = namespaces
        self.shared = shared
        self.queue = queue
        self.clock = clock
        self.promises = Promises(placement, check=self.check_writable)
        self._through = [s for s in self.slots if s.index > 0 and s.tier.config.write is WriteMode.THROUGH]

    def put(self, name: str, data: Any, *, parent: str | None = None, promise: Promise | None = None) -> BlockStat:
        """Seal *data* (any buffer, or a :class:`~kvfs.pieces.Pieces`: sealed without
        joining them) as block *name*, replacing an existing block atomically.

        The block lands in the hottest tier that can take it (evicting by policy), or in
        the room *promise* holds for it (:meth:`kvfs.promises.Promises.make`); write-through
        tiers below get a copy when ``Store.run_pending`` runs. Readers that opened the old
        block keep its bytes. Raises :class:`NoSpace` when no tier can take it,
        :class:`IsADirectory` when *name* is a directory.
        """
        name = normalize(name)
        self.check_writable(name)
        pieces = Pieces.of(data)
        csum = compute_checksum(pieces)
        now = self.clock()
        rec = BlockRecord(name, len(pieces), csum, created=now, accessed=now, parent=parent)
        return self.placement.drive(self._seal(rec, pieces, promise))

    def _seal(self, rec: BlockRecord, pieces: Pieces, promise: Promise | None) -> Flow[BlockStat]:
        """:meth:`put`'s work under the lock (a flow: the lock is let go for the steps
        that write a persistent tier, ``Placement.drive``)."""
        p = self.placement
        name = rec.name
        old = self.seal_begin(name)
        if old is not None:
            for j in old.tier_indexes():
                self.slots[j].policy.remove(name)
        placed = (yield from self.promises.keep(promise, rec, pieces)) if promise is not None else None
        placed = placed or (yield from p.place(rec, pieces))
        if placed is None:
            old = self.catalog.get(name)  # again: the lock may have been let go meanwhile
            if old is not None and not old.pinned:
                for j in old.tier_indexes():
                    p.policy_insert(self.slots[j], old)
            raise p.no_space(rec)
        return self.seal_end(rec, placed)

    def check_writable(self, name: str) -> None:
        """Raise :class:`NamespaceRetired` when *name* lies in a retired namespace (its
        model's KV is stale), :class:`InvalidName` when a component of it is reserved for
        kvfs's own files (:func:`kvfs.names.check_creatable`): every way of writing a
        block asks this first."""
        check_creatable(name)
        ns = self.namespaces.of(name)
        if ns is not None and ns.retired:
            raise NamespaceRetired(
                f"{name!r}: namespace {ns.path!r} is retired (its model's KV is stale); write to its successor"
            )

    def seal_begin(self, name: str) -> BlockRecord | None:
        """Under the lock, before a new version of *name* is placed: the current record
        (None for a new name, whose directories are made). Raises :class:`IsADirectory`,
        and :class:`StoreBusy` inside ``Store.nowait`` when the old version's files must go."""
        p = self.placement
        if self.catalog.is_dir(name):
            raise IsADirectory(f"{name!r} is a directory")
        old = self.catalog.get(name)
        if old is None:
            self.catalog.ensure_dir(parent_of(name))
        elif p.waiting_forbidden:  # dropping the old version's files needs I/O
            for i in old.tier_indexes():
                if self.slots[i].persistent and not self.slots[i].shared:
                    p.require_io(i, "replacing a block")
        return old

    def seal_end(self, rec: BlockRecord, placed: TierSlot, *, through: bool = True) -> BlockStat:
        """Under the lock, once the new block *rec* has its first copy in *placed*: it
        replaces the old version (whose other copies are dropped) and, if *through* (not
        read from a peer), is queued for the write-through tiers below."""
        p = self.placement
        name = rec.name
        old = self.catalog.get(name)  # again: the lock may have been let go meanwhile
        if old is not None:
            for j in list(old.tier_indexes()):
                slot = self.slots[j]
                if j == placed.index:
                    p.forget_copy(slot, old, policy=False)  # overwritten in place by the new copy
                else:
                    p.drop_copy(slot, old)
            self.catalog.discard(old)
        self.catalog.add(rec)
        self.shared.forget_missing(name)
        for slot in self._through if through else ():
            if slot.index > placed.index:
                self.queue.copy(rec, slot.index)
        return rec.stat(p.names)
