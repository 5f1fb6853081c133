"""Assembling a store from a config: the one place a :class:`~kvfs.config.Config` becomes
open tiers and a :class:`~kvfs.store.Store`.

``open_store(config)`` opens every tier hottest first (each local tier takes its arena or
directory for itself: a second daemon on the same one is refused), closes the ones already
opened when a later one fails, and builds the store with the config's policy and
shared-tier settings. ``capacity_warnings(config)`` says what a config risks at unmount:
DRAM is exclusive (a block's only copy may be there, write-back), so when the persistent
tiers together are smaller than DRAM, a clean unmount cannot write everything down.
"""

from __future__ import annotations

from typing import Any

from kvfs.config import Config
from kvfs.store import Store
from kvfs.tier import Tier
from kvfs.tiers import open_tier
from kvfs.units import format_size

__all__ = ["capacity_warnings", "open_store", "open_tiers"]


def open_tiers(config: Config) -> list[Tier]:
    """Every tier of *config*, hottest first; none is left open if one fails."""
    tiers: list[Tier] = []
    try:
        for tc in config.tiers:
            tiers.append(open_tier(tc))
    except BaseException:
        for t in reversed(tiers):
            t.close()
        raise
    return tiers


def open_store(config: Config, **kwargs: Any) -> Store:
    """A store over the tiers of *config*; *kwargs* go to :class:`Store` (a test's clock)."""
    tiers = open_tiers(config)
    try:
        kwargs.setdefault("negative_ttl", config.mount.negative_ttl)
        kwargs.setdefault("listing_ttl", config.mount.listing_ttl)
        return Store(tiers, policy=config.policy, **kwargs)
    except BaseException:
        for t in reversed(tiers):
            t.close()
        raise


def capacity_warnings(config: Config) -> list[str]:
    """What *config* cannot promise at unmount, one sentence each (empty when nothing)."""
    volatile = [t for t in config.tiers if t.kind.value == "dram"]
    persistent = [t for t in config.tiers if t.kind.value != "dram"]
    if not volatile:
        return []
    dram = sum(t.capacity or 0 for t in volatile)
    if not persistent:
        return [
            (
                f"no persistent tier is configured: the {format_size(dram)} of DRAM is all there is, and "
                "every block is lost at unmount; add a disk tier to keep them"
            )
        ]
    if any(t.capacity is None for t in persistent):
        return []
    room = sum(t.capacity or 0 for t in persistent)
    if room >= dram:
        return []
    names = ", ".join(t.name for t in persistent)
    return [
        (
            f"the persistent tiers ({names}: {format_size(room)}) are smaller than DRAM ({format_size(dram)}): "
            "a clean unmount cannot write every block that is only in DRAM down, and kvfs umount reports "
            "the ones it loses; give the persistent tiers at least the DRAM tier's capacity"
        )
    ]
