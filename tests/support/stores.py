"""Stores over real tiers in the test's own process (a shared-memory arena, a disk
directory): a small two-tier store and a fake clock."""

from __future__ import annotations

import random
from pathlib import Path

from kvfs.config import DiskConfig, DramConfig, PolicyConfig, PromoteMode
from kvfs.names import TierName
from kvfs.store import Store
from kvfs.tiers.disk import DiskTier
from kvfs.tiers.dram import DramTier

BLOCK = 64 << 10  # the DRAM tier of make() holds blocks * BLOCK


def blob(i: int, size: int = BLOCK) -> bytes:
    return random.Random(i).randbytes(size)


def make(tmp_path: Path, blocks: int = 4, promote: PromoteMode = PromoteMode.ALWAYS, clock=None) -> Store:
    """A store of a DRAM tier of *blocks* blocks over a 64 MiB disk tier under *tmp_path*."""
    tiers = [
        DramTier(DramConfig(name=TierName("dram"), capacity=blocks * BLOCK, mlock=False, prefault=False)),
        DiskTier(DiskConfig(name=TierName("disk"), capacity=64 << 20, path=tmp_path / "disk")),
    ]
    kw = {} if clock is None else {"lease_clock": clock}
    return Store(tiers, policy=PolicyConfig(eviction="lru", promote=promote), **kw)


class Clock:
    """A fake clock for lifetimes and leases: each call is one second later."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t
