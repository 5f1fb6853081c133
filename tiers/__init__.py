"""Tier implementations, one module each, found by kind and imported on first use.

``open_tier(config)`` builds the tier a config entry describes. A whole store is
assembled from a config in :mod:`kvfs.mount.assembly`, not here.
"""

from __future__ import annotations

import importlib

from kvfs.config import TierConfig
from kvfs.tier import Tier

__all__ = ["TIER_CLASSES", "open_tier"]

# kind -> "module:Class"; a tier module is imported only when a config uses it.
TIER_CLASSES: dict[str, str] = {
    "dram": "kvfs.tiers.dram:DramTier",
    "disk": "kvfs.tiers.disk:DiskTier",
    "posix": "kvfs.tiers.posix:PosixTier",
    "s3": "kvfs.tiers.s3:S3Tier",
}


def open_tier(config: TierConfig) -> Tier:
    module, _, cls = TIER_CLASSES[config.kind.value].partition(":")
    tier: Tier = getattr(importlib.import_module(module), cls)(config)
    return tier
