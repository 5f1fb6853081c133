"""Changing a block's name or removing it: :meth:`Store.delete` and :meth:`Store.rename`.

:class:`Renames` is the store's collaborator for both. Local copies change in place (a DRAM
entry under the store's lock, a disk file with the lock let go and both names held busy);
shared copies are deleted, and re-published under a new name, in the background, so a hung
shared tier never stalls the caller.
"""

from __future__ import annotations

import logging
import time

from .backlog import WriteThroughQueue
from .catalog import BlockRecord, Catalog
from .errors import (
    BlockNotFound,
    CrossNamespace,
    IsADirectory,
    NamespaceRetired,
    StoreBusy,
)
from .events import EventKind
from .moves import CopyRenames
from .names import check_creatable, normalize, parent_of
from .namespaces import Namespaces, NamespaceState
from .placement import Placement
from .revalidation import SharedRecords
from .shared import SharedView
from .slot import TierSlot

__all__ = ["Renames"]

log = logging.getLogger("kvfs.store")

_BUSY_WAIT = 10.0  # seconds a rename waits for a busy copy of either name before it gives up


class _CopyBusy(StoreBusy):
    """A copy a rename must move is busy now (its move to or from another tier)."""


class Renames:
    """Delete and rename of the blocks *placement* keeps (see the module doc): *namespaces*
    say where a block may go, *records* drops a deleted block and runs the shared tiers'
    deletes, *shared* and *queue* delete and re-publish the shared copies."""

    def __init__(
        self,
        placement: Placement,
        catalog: Catalog,
        namespaces: Namespaces,
        records: SharedRecords,
        shared: SharedView,
        queue: WriteThroughQueue,
    ) -> None:
        self.placement = placement
        self.catalog = catalog
        self.slots = placement.slots
        self.namespaces = namespaces
        self.records = records
        self.shared = shared
        self.queue = queue

    def delete(self, name: str) -> None:
        """Remove the block from every tier (shared ones too). :class:`BlockNotFound` if absent.

        Local copies go now; every shared tier gets a delete even where this node has no
        record of a copy (another node may have written one since). Those deletes run in
        the background, so a hung shared tier does not stall the caller (which waits for
        them at most ``shared_wait``); until they ran, no shared copy of the name is
        believed here, and nothing republishes the name there first.
        """
        name = normalize(name)
        self.records.refresh(name)
        p = self.placement
        with p.locked():
            rec = self.catalog.require(name)
            if p.waiting_forbidden:
                for i in rec.tier_indexes():
                    if self.slots[i].persistent and not self.slots[i].shared:
                        p.require_io(i, "deleting a file")
            self.records.drop_record(rec, "deleted")
            for slot in self.shared.slots:
                p.delete_copy(slot, name)
            self.shared.remember_missing(name)
            self.shared.forget_listing(parent_of(name))
            nowait = p.waiting_forbidden
        self.records.run_deletes(name, wait=not nowait)

    def rename(self, old: str, new: str) -> None:
        """Rename block *old* to *new*, atomically replacing a block named *new*.

        Local copies are renamed in place (a DRAM entry under the lock, a disk file with
        the lock let go); shared copies are deleted under the old name and written under
        the new one in the background, unless the block has no local copy, when they are
        renamed now (outside the lock). A local copy of either name that is busy (being
        copied to another tier, say) is waited for, up to :data:`_BUSY_WAIT` seconds;
        where waiting is forbidden (``Store.nowait``) it is :class:`StoreBusy` at once.
        """
        deadline = time.monotonic() + _BUSY_WAIT
        while True:
            try:
                return self._rename(old, new)
            except _CopyBusy:
                if self.placement.waiting_forbidden or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)  # a copy's move takes a file write: it ends soon

    def _rename(self, old: str, new: str) -> None:
        old, new = normalize(old), normalize(new)
        check_creatable(new)
        src, dst = self.namespaces.of(old), self.namespaces.of(new)
        if src is not dst:
            raise CrossNamespace(
                f"{old!r} is in {_ns_label(src)} and {new!r} in {_ns_label(dst)}: a block cannot move between "
                "namespaces by rename (their quotas and owners differ); copy it and remove the original"
            )
        if dst is not None and dst.retired:
            raise NamespaceRetired(f"{new!r}: namespace {dst.path!r} is retired")
        self.records.refresh(old)
        p = self.placement
        with p.locked():
            rec = self.catalog.require(old)
            if old == new:
                return
            if self.catalog.is_dir(new):
                raise IsADirectory(f"{new!r} is a directory")
            has_local = bool(rec.tiers & p.local_mask)
            moves = [
                self.slots[i]
                for i in rec.tier_indexes()
                if self.slots[i].persistent and (not self.slots[i].shared or not has_local)
            ]
            for slot in moves:
                p.require_io(slot.index, "renaming a copy")
                if slot.is_busy(old) or slot.is_busy(new):
                    raise _CopyBusy(f"the copy of {old!r} or {new!r} in {slot.name!r} is in use; try again", slot.index)
            if self.catalog.get(new) is None:
                self.catalog.ensure_dir(parent_of(new))
            if not moves:  # memory only: the whole rename under the lock, atomic for readers
                self._commit(rec, old, new, [])
                return
            step = CopyRenames(p, rec, old, new, moves)
        # the files are renamed with the lock let go (both names held busy meanwhile)
        try:
            step.run()
        except BaseException:
            with p.locked():
                step.abort()
            raise
        with p.locked():
            moved = step.complete()
            for slot in moves:
                if slot not in moved:
                    log.warning("rename %s -> %s failed in tier %s: %s", old, new, slot.name, step.errors[slot.index])
            self._commit(rec, old, new, moved)

    def _commit(self, rec: BlockRecord, old: str, new: str, moved: list[TierSlot]) -> None:
        """Under the lock: give *rec* the name *new*, its copies in *moved* renamed already,
        replacing the block named *new*; the rest of its copies follow (a DRAM entry now,
        shared copies re-published in the background). :class:`BlockNotFound` when *rec*
        was deleted or replaced while its files were renamed (the renamed files are
        nobody's, and deleted) or no copy survived."""
        p = self.placement
        if not p.is_current(rec):
            for slot in moved:  # deleted or replaced meanwhile: the renamed files are nobody's
                if not (target := self.catalog.get(new)) or not target.tiers & slot.bit:
                    p.delete_copy(slot, new)
            raise BlockNotFound(old)
        target = self.catalog.get(new)
        if target is not None:
            for j in list(target.tier_indexes()):
                slot = self.slots[j]
                if slot in moved or (not slot.persistent and rec.tiers & slot.bit):
                    p.forget_copy(slot, target)  # replaced by the renamed copy
                else:
                    p.drop_copy(slot, target)
            self.catalog.discard(target)
        for i in list(rec.tier_indexes()):
            slot = self.slots[i]
            if slot.shared and slot not in moved:  # re-published under the new name below
                p.forget_copy(slot, rec)
                p.delete_copy(slot, old)
                self.queue.copy(rec, slot.index)
            elif not slot.persistent:
                slot.tier.rename(old, new)  # memory: under the lock, atomic for readers
        # footprints depend on the name (header length): recount under the new name
        for i in rec.tier_indexes():
            slot = self.slots[i]
            self.catalog.count_out(i, p.footprint(slot, rec), rec.name)
            slot.policy.remove(old)
        self.catalog.rename(rec, new)
        for i in rec.tier_indexes():
            slot = self.slots[i]
            self.catalog.count_in(i, p.footprint(slot, rec), rec.name)
            if not rec.pinned:
                p.policy_insert(slot, rec)
        self.shared.forget_missing(new)
        self.shared.forget_listing(parent_of(old))
        self.shared.forget_listing(parent_of(new))
        p.emit(EventKind.RENAMED, rec, detail=old)
        if not rec.tiers:
            p.lose_if_empty(rec, "no copy survived the rename")
            raise BlockNotFound(old)


def _ns_label(ns: NamespaceState | None) -> str:
    return "no namespace" if ns is None else f"namespace {ns.path!r}"
