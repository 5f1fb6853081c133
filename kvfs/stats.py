"""Counters the store keeps per tier, and the frozen snapshots ``Store.statistics()`` returns."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["StoreStatistics", "TierCounters", "TierStatistics"]


@dataclass(slots=True)
class TierCounters:
    """Mutable counters of one tier, updated under the store's lock. (Failed calls are
    counted by the tier's :class:`~kvfs.health.HealthBreaker`.)"""

    hits: int = 0  # reads served from this tier
    bytes_read: int = 0
    bytes_written: int = 0
    stored: int = 0  # blocks sealed into this tier by a write
    promotions: int = 0  # blocks copied into this tier from a colder one
    demotions: int = 0  # blocks copied into this tier from a hotter one
    evictions: int = 0  # copies dropped from this tier to make room or by request
    corrupt: int = 0  # copies that failed their checksum (on a read, a check or at start)


@dataclass(frozen=True, kw_only=True, slots=True)
class TierStatistics:
    name: str
    kind: str
    capacity: int | None
    used: int
    blocks: int
    healthy: bool
    persistent: bool
    shared: bool
    hits: int
    bytes_read: int
    bytes_written: int
    stored: int
    promotions: int
    demotions: int
    evictions: int
    corrupt: int
    errors: int

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreStatistics:
    blocks: int
    lookups: int
    misses: int
    pending_writes: int
    tiers: tuple[TierStatistics, ...]
    leases: int = 0
    """Copies held for readers outside the store (batch clients, the GPU agent)."""
    reserved: int = 0
    """Extents reserved for blocks clients are writing (two-phase puts)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "lookups": self.lookups,
            "misses": self.misses,
            "pending_writes": self.pending_writes,
            "tiers": [t.to_json() for t in self.tiers],
            "leases": self.leases,
            "reserved": self.reserved,
        }
