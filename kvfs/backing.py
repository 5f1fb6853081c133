"""Block files for readers that read them by themselves (FUSE passthrough).

:meth:`BackingFiles.open` hands out the open file of a block's hottest copy when that copy
is a file holding exactly the payload (the disk tier's version-3 layout), checked against
the block's checksum (:meth:`kvfs.tier.Tier.open_file`), so that the kernel can serve the
block's bytes from that file without asking the daemon. When the hottest copy is in DRAM
(served from memory anyway) or in a tier without such files, it answers None and the
caller reads the block through :meth:`kvfs.store.Store.open`. A copy that turns out bad
is dropped and counted as on any read, and the next copy is tried. Such a read counts as
a hit (policy, access time) but promotes nothing: the daemon never holds the bytes.
"""

from __future__ import annotations

from .catalog import Catalog
from .moves import Flow
from .placement import Placement
from .reading import Reading
from .revalidation import SharedRecords
from .tier import BackingFile, Tier

__all__ = ["BackingFiles"]


class BackingFiles:
    """Open block files (see the module doc). *reading* counts a read served outside
    the store (:meth:`kvfs.reading.Reading.count_read`)."""

    def __init__(self, placement: Placement, catalog: Catalog, records: SharedRecords, reading: Reading) -> None:
        self.placement = placement
        self.catalog = catalog
        self.records = records
        self.reading = reading

    def open(self, name: str) -> BackingFile | None:
        """The checked file of block *name*'s hottest copy, or None (see the module doc).
        *name* is normalized. Raises :class:`~kvfs.errors.BlockNotFound` for a missing
        block; may do tier I/O (call it from a worker thread)."""
        self.records.refresh(name)
        p = self.placement
        try:
            return p.drive(self._open(name))
        except _NoFile:
            return None  # a header before the payload: read through the store

    def _open(self, name: str) -> Flow[BackingFile | None]:
        """:meth:`open`'s work (a flow: each file is opened in a step with the lock let go)."""
        p = self.placement
        rec = self.catalog.require(name)
        for slot in p.hottest_first(rec):
            if not slot.persistent or slot.shared:
                return None  # DRAM serves it from memory; a shared copy is read through the store
            if not slot.usable():
                continue
            result = yield from p.fetch(slot, rec, _open_file, _unpack_file)
            if result is None:
                continue  # gone or bad (dropped and counted): the next copy
            self.reading.count_read(rec, slot)
            return result
        return None

    def touch(self, name: str, checksum: int, size: int) -> bool:
        """A read of block *name* (version *checksum*, *size*) served from a file the
        reader already holds: True, counted as a hit of the block's hottest copy, when
        that version is still the block's; False when it is gone or replaced. Catalog
        only (under the lock, no I/O: ``Store.nowait`` may run it)."""
        p = self.placement
        with p.locked():
            rec = self.catalog.get(name)
            if rec is None or not rec.tiers or rec.checksum != checksum or rec.size != size:
                return False
            i = (rec.tiers & -rec.tiers).bit_length() - 1
            self.reading.count_read(rec, p.slots[i])
            return True


def _open_file(tier: Tier, name: str) -> BackingFile:
    f = tier.open_file(name)
    if f is None:
        raise _NoFile(name)
    return f


def _unpack_file(f: BackingFile) -> tuple[BackingFile, int]:
    return f, f.checksum


class _NoFile(Exception):
    """This copy has no file of the payload alone (a header before it)."""
