"""Counters the store keeps per tier and per peer, and the frozen snapshots ``Store.statistics()`` returns."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["FETCH_BUCKETS", "PeerCounters", "PeerStatistics", "StoreStatistics", "TierCounters", "TierStatistics"]

FETCH_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Upper bounds (seconds) of the peer fetch latency histogram's buckets (then +Inf)."""


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


@dataclass(slots=True)
class PeerCounters:
    """Mutable counters of one peer of a cluster node (``kvfs.peers``): what this node
    read from it and what it served to it. Updated by several threads: through
    :meth:`add` and :meth:`fetched`, under :attr:`lock`."""

    hits: int = 0  # blocks read from it and published here
    bytes_read: int = 0
    misses: int = 0  # asked, and it did not serve the block (no longer held, denied, busy)
    corrupt: int = 0  # blocks whose bytes failed their check (never published)
    busy: int = 0  # reads given up: every landing buffer for it stayed in use until the deadline
    fetch_seconds: float = 0.0  # total time of the reads counted in hits
    fetch_buckets: list[int] = field(default_factory=lambda: [0] * (len(FETCH_BUCKETS) + 1))
    served: int = 0  # blocks it read from this node
    bytes_served: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, counter: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, counter, getattr(self, counter) + n)

    def fetched(self, seconds: float, size: int) -> None:
        """Count one block of *size* bytes read from the peer in *seconds*."""
        with self.lock:
            self.hits += 1
            self.bytes_read += size
            self.fetch_seconds += seconds
            self.fetch_buckets[bisect.bisect_left(FETCH_BUCKETS, seconds)] += 1


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerStatistics:
    """One peer as this node sees it: ``healthy`` (its breaker lets it be asked),
    ``errors`` (timeouts, refused connections), ``blocks`` it is known to hold (from its
    events), the :class:`PeerCounters`; ``fetch_buckets`` are cumulative counts per
    bound of :data:`FETCH_BUCKETS`, then the total (Prometheus' ``le``)."""

    name: str
    healthy: bool
    errors: int
    blocks: int
    hits: int
    bytes_read: int
    misses: int
    corrupt: int
    busy: int
    fetch_seconds: float
    fetch_buckets: tuple[int, ...]
    served: int
    bytes_served: int

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
    peers: tuple[PeerStatistics, ...] = ()
    """A cluster node's peers (docs/cluster.md); none elsewhere."""

    def to_json(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "lookups": self.lookups,
            "misses": self.misses,
            "pending_writes": self.pending_writes,
            "tiers": [t.to_json() for t in self.tiers],
            "leases": self.leases,
            "reserved": self.reserved,
            "peers": [p.to_json() for p in self.peers],
        }
