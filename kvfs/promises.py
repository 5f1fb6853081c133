"""Room promised to a block before it is sealed: ``Store.promise``, kept by ``Store.put``.

The mount seals a file when the kernel releases it, after the writer's ``close`` has
returned, so a seal that finds no room has no caller left to tell. The room is promised
earlier, at the ``close`` itself (the FLUSH the kernel waits for): :meth:`Promises.make`
makes room for the file's bytes in the hottest tier that can take them, exactly as a seal
would (evicting by policy, within the namespace's quota, never another namespace's blocks
for it), and holds it in the tier's (and the namespace's) reserved bytes, so no other
placement takes it. When no tier can, the ``close`` fails with ``ENOSPC`` and nothing is
published; when one can, the seal that follows finds its room waiting
(:meth:`Promises.keep`) and cannot fail for want of space. So a block is never accepted and
then dropped for want of room.

A promise is *held* until it is *kept* (the seal took the room) or *broken* (the file was
not published after all: unlinked, failed, its writer killed, or a later close promised
it again for a new size). Keeping happens under the store's lock; breaking happens
wherever the file ends (the FUSE loop) without the lock: the promise is queued and the
placement gives its room back the next time it makes room (:meth:`Placement.make_room`),
so the loop never waits on the store's lock for it. The two are decided under the lock:
whichever comes first wins.

Limits: a promise is for the size the file had at that ``close``; bytes written after it
(through a descriptor still open) are promised again at that descriptor's close. A tier
that fails between the promise and the seal (a disk error) fails the seal as any I/O
error does: logged and counted, nothing published.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .catalog import BlockRecord
from .errors import IsADirectory
from .events import EventKind
from .moves import Flow
from .names import normalize

if TYPE_CHECKING:
    from .namespaces import NamespaceState
    from .placement import Placement
    from .slot import TierSlot

__all__ = ["Promise", "PromiseState", "Promises"]


class PromiseState(enum.StrEnum):
    """Where a :class:`Promise` is: ``HELD``, then ``KEPT`` (a seal used its room) or
    ``BROKEN`` (its room given back unused)."""

    HELD = "held"
    KEPT = "kept"
    BROKEN = "broken"


@dataclass(eq=False)
class Promise:
    """Room for *size* bytes of block *name* in *slot* (its footprint *fp* there), counted
    in the slot's and *ns*'s reserved bytes while ``state`` is ``held``."""

    name: str
    size: int
    slot: TierSlot
    fp: int
    ns: NamespaceState | None
    state: PromiseState = PromiseState.HELD

    def holds(self, ns: NamespaceState | None) -> bool:
        """Whether its room is still held, for a block of namespace *ns*."""
        return self.state is PromiseState.HELD and ns is self.ns

    def give_back(self) -> bool:
        """Under the store's lock: end it unused (``BROKEN``); False when it had ended already."""
        return self.end(PromiseState.BROKEN)

    def end(self, state: PromiseState) -> bool:
        """Under the store's lock: give the room back (it was kept or broken); False when
        it had ended already."""
        if self.state is not PromiseState.HELD:
            return False
        self.state = state
        self.slot.reserved -= self.fp
        if self.ns is not None:
            self.ns.reserved[self.slot.index] -= self.fp
        return True


class Promises:
    """Promises of room on *placement*'s tiers (see the module doc); *check* raises for a
    name no block may be written under (``Sealing.check_writable``)."""

    def __init__(self, placement: Placement, *, check: Callable[[str], None]) -> None:
        self.placement = placement
        self.check = check

    def make(self, name: str, size: int) -> Promise:
        """Room for *size* bytes of block *name* in the hottest tier that can make it, as
        :meth:`Placement.place` would place it, held until ``Store.put`` keeps it or
        :meth:`give_up` gives it back. Raises :class:`~kvfs.errors.NoSpace` (naming each
        tier's reason) when none can, and what a put raises for a name no block may have
        (retired namespace, reserved name, a directory)."""
        name = normalize(name)
        self.check(name)
        return self.placement.drive(self._make(name, size))

    def _make(self, name: str, size: int) -> Flow[Promise]:
        p = self.placement
        if p.catalog.is_dir(name):
            raise IsADirectory(f"{name!r} is a directory")
        p.settle_promises()
        ns = p.namespaces.of(name) if p.namespaces else None
        for slot in p.slots:
            if slot.is_busy(name) or not slot.usable():
                continue
            fp = slot.footprint(name, size)
            if not (yield from p.make_room(slot, fp, ns=ns)):
                continue
            slot.reserved += fp
            if ns is not None:
                ns.reserved[slot.index] += fp
            return Promise(name, size, slot, fp, ns)
        raise p.no_space(BlockRecord(name, size, 0))

    def keep(self, promise: Promise, rec: BlockRecord, data: Any) -> Flow[TierSlot | None]:
        """A flow (``Placement.drive``): place the new block *rec* (*data*, its bytes) in the room
        *promise* holds for it: the slot that took it, or None (the promise had ended, was
        for another namespace — renamed since — or the tier refused it after all: the
        caller places it as any put). A :class:`~kvfs.errors.StoreBusy` (the tier needs
        I/O inside ``Store.nowait``) leaves the promise held, for the call made again in a
        worker thread."""
        p = self.placement
        p.settle_promises()
        ns = p.namespaces.of(rec.name) if p.namespaces else None
        if not promise.holds(ns):
            promise.end(PromiseState.BROKEN)
            return None
        slot = promise.slot
        if slot.persistent:
            p.require_io(slot.index, "writing a copy")  # before the room is given back
        promise.end(PromiseState.KEPT)
        try:
            placed = yield from p.copy_into(slot, rec, data, EventKind.STORED, new=True)
        except BaseException:
            if promise.state is PromiseState.KEPT:  # not placed: hold the room again for the retry
                promise.state = PromiseState.HELD
                slot.reserved += promise.fp
                if promise.ns is not None:
                    promise.ns.reserved[slot.index] += promise.fp
            raise
        return slot if placed else None

    def give_up(self, promise: Promise) -> None:
        """*promise* will not be kept: its room goes back the next time the placement
        makes room (:meth:`Placement.settle_promises`). Thread-safe and never waits (the
        FUSE loop calls it)."""
        if promise.state is PromiseState.HELD:
            self.placement.given_up.append(promise)
