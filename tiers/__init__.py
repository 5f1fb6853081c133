"""Tier implementations, one module each, found by kind and imported on first use.

``open_tier(config)`` builds the tier a config entry describes; ``open_store(config)``
builds the whole stack and the store over it.
"""

from __future__ import annotations

import importlib

from kvfs.config import Config, TierConfig
from kvfs.tier import Tier

__all__ = ["TIER_CLASSES", "open_store", "open_tier"]

# kind -> "module:Class"; a tier module is imported only when a config uses it.
TIER_CLASSES: dict[str, str] = {
    "dram": "kvfs.tiers.dram:DramTier",
    "disk": "kvfs.tiers.disk:DiskTier",
    "posix": "kvfs.tiers.posix:PosixTier",
    "s3": "kvfs.tiers.s3:S3Tier",
}


def open_tier(config: TierConfig) -> Tier:
    module, _, cls = TIER_CLASSES[config.kind.value].partition(":")
    return getattr(importlib.import_module(module), cls)(config)


def open_store(config: Config, **kwargs):
    """Open every tier of *config* (hottest first) and a :class:`~kvfs.store.Store` over
    them. Tiers opened before a failure are closed again."""
    from kvfs.store import Store

    tiers: list[Tier] = []
    try:
        for tc in config.tiers:
            tiers.append(open_tier(tc))
        kwargs.setdefault("negative_ttl", config.mount.negative_ttl)
        kwargs.setdefault("listing_ttl", config.mount.listing_ttl)
        return Store(tiers, policy=config.policy, **kwargs)
    except BaseException:
        for t in tiers:
            t.close()
        raise
