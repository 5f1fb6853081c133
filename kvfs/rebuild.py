"""Rebuilding the catalog at start from what the local persistent tiers hold
(``Store.rebuild``): every block file a tier's :meth:`~kvfs.tier.Tier.scan` finds becomes
a copy of its block; the hotter tier's version wins when two disagree; a corrupt file
(its header, or a name that is not a valid kvfs name or not its own path) is counted and
never becomes a block. Shared tiers are not scanned: what they hold is learned on demand
(:mod:`kvfs.revalidation`).
"""

from __future__ import annotations

import logging

from .catalog import BlockRecord
from .errors import InvalidName, KvfsError
from .events import EventKind
from .names import normalize
from .placement import Placement

__all__ = ["rebuild_catalog"]

log = logging.getLogger("kvfs.store")


def rebuild_catalog(placement: Placement, *, now: float, learn_shared: bool) -> tuple[int, int]:
    """Add every block found in *placement*'s local persistent tiers to its catalog, as
    created and accessed at *now* (*learn_shared*: the first revalidation of each asks
    the shared tiers which hold it). Returns ``(copies found, corrupt files)``. Runs
    before the store serves (it reads the tiers under the lock)."""
    found = corrupt = 0
    p = placement
    with p.locked():
        for slot in p.slots:
            if not slot.persistent or slot.shared:
                continue
            for info in slot.tier.scan():
                if info.problem is None:
                    try:
                        if normalize(info.name) != info.name or not info.name:
                            raise InvalidName(f"{info.name!r} is not a normalized kvfs name")
                    except InvalidName as exc:
                        info = type(info)(info.name, info.size, info.checksum, str(exc))
                if info.problem is not None:
                    slot.counters.corrupt += 1
                    corrupt += 1
                    log.error("rebuild: corrupt file in tier %s skipped: %s", slot.name, info.problem)
                    p.emit(EventKind.CORRUPT, info.name, slot, info.problem)
                    continue
                rec = p.catalog.get(info.name)
                if rec is None:
                    rec = BlockRecord(
                        info.name, info.size, info.checksum, created=now, accessed=now, learn_shared=learn_shared
                    )
                    try:
                        p.catalog.add(rec)
                    except KvfsError as exc:
                        log.warning("rebuild: %s in tier %s skipped: %s", info.name, slot.name, exc)
                        continue
                elif rec.checksum != info.checksum or rec.size != info.size or rec.tiers & slot.bit:
                    log.warning("rebuild: %s in tier %s differs from a hotter copy; ignored", info.name, slot.name)
                    continue
                p.add_copy(slot, rec)
                found += 1
    return found, corrupt
