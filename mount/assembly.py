"""Assembling a store from a config: the one place a :class:`~kvfs.config.Config` becomes
open tiers and a :class:`~kvfs.store.Store`.

``open_store(config)`` opens every tier hottest first (each local tier takes its arena or
directory for itself: a second daemon on the same one is refused), closes the ones already
opened when a later one fails, and builds the store with the config's policy and
shared-tier settings. ``capacity_warnings(config)`` says what a config risks at unmount:
DRAM is exclusive (a block's only copy may be there, write-back), so when the persistent
tiers together are smaller than DRAM, a clean unmount cannot write everything down; it
also names namespaces whose models differ only by their weights fingerprint (one holds
stale KV), and namespace owners no other user can reach without ``allow_other``.
"""

from __future__ import annotations

import os
from typing import Any

from kvfs.config import Config
from kvfs.namespaces import fingerprint_warnings
from kvfs.store import Store
from kvfs.tier import Tier
from kvfs.tiers import open_tier
from kvfs.units import format_size

__all__ = ["capacity_warnings", "namespace_warnings", "open_store", "open_tiers"]


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
        kwargs.setdefault("open_copies", config.mount.open_copies)
        return Store(tiers, policy=config.policy, namespaces=config.namespaces, **kwargs)
    except BaseException:
        for t in reversed(tiers):
            t.close()
        raise


def capacity_warnings(config: Config) -> list[str]:
    """What *config* cannot promise, one sentence each (empty when nothing): at unmount,
    and for its namespaces (:func:`namespace_warnings`)."""
    return _unmount_warnings(config) + namespace_warnings(config)


def namespace_warnings(config: Config) -> list[str]:
    """Namespaces that differ only by the model fingerprint, and owners other than the
    mounting user while other users cannot use the mount."""
    out = fingerprint_warnings(config.namespaces)
    volatile = [t.name for t in config.tiers if t.kind.value == "dram"]
    persistent = [t.name for t in config.tiers if t.kind.value != "dram"]
    for ns in config.namespaces:
        hot = sum(ns.quota.get(t, 0) for t in volatile)
        if hot and persistent and all(t in ns.quota for t in persistent):
            room = sum(ns.quota[t] for t in persistent)
            if room < hot:
                out.append(
                    f"namespace {ns.path}'s quotas in the persistent tiers ({format_size(room)}) are smaller than "
                    f"in DRAM ({format_size(hot)}): a clean unmount cannot write all its DRAM-only blocks down; "
                    "give it at least as much below"
                )
    me = os.getuid()
    others = [ns.path for ns in config.namespaces if ns.owner is not None and ns.owner != me]
    if others and not config.mount.allow_other:
        out.append(
            f"namespaces {', '.join(others)} belong to other users, but [mount] allow_other is false: "
            f"only uid {me} can use the mount; set allow_other = true"
        )
    return out


def _unmount_warnings(config: Config) -> list[str]:
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
