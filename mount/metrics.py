"""Prometheus metrics of one mount, served over HTTP when ``mount.metrics_port`` is set.

A custom collector reads ``store.statistics()`` and the mount's
:class:`~kvfs.mount.opstats.OpStats` at each scrape (no counters kept twice), into a
registry of its own per mount (never the process-global one), so several mounts in one
process, as in tests, keep separate figures. The metric names below are what
``docs/grafana-dashboard.json`` queries; change both together.

Per tier (label ``tier``; ``kind`` on the info-like gauges):

- ``kvfs_tier_capacity_bytes``, ``kvfs_tier_used_bytes``, ``kvfs_tier_blocks``
- ``kvfs_tier_healthy`` (1 healthy, 0 marked unhealthy after a failure or timeout)
- ``kvfs_tier_hits_total`` (reads served from the tier), ``kvfs_tier_misses_total``
  (reads that reached the tier — missed every hotter one — and were not served by it:
  lookups minus hits in this and hotter tiers)
- ``kvfs_tier_read_bytes_total``, ``kvfs_tier_written_bytes_total``
- ``kvfs_tier_stored_total``, ``kvfs_tier_promotions_total``, ``kvfs_tier_demotions_total``,
  ``kvfs_tier_evictions_total``, ``kvfs_tier_corrupt_total``, ``kvfs_tier_errors_total``

Per namespace (label ``namespace``; ``tier`` where per tier; docs/tenants.md):

- ``kvfs_namespace_used_bytes``, ``kvfs_namespace_quota_bytes`` (only where it has a quota),
  ``kvfs_namespace_copies`` (per tier); ``kvfs_namespace_blocks``
- ``kvfs_namespace_quota_evictions_total`` (copies evicted to keep it within its quota,
  per tier), ``kvfs_namespace_refused_total`` (writes refused at its quota: ENOSPC),
  ``kvfs_namespace_expired_total`` (blocks removed by its retention, or as retired)

Per peer of a cluster node (label ``peer``; docs/cluster.md):

- ``kvfs_peer_healthy`` (1 while it may be asked, 0 while skipped after a failure),
  ``kvfs_peer_blocks`` (blocks it is known to hold, from its events)
- ``kvfs_peer_hits_total`` (blocks read from it and published here),
  ``kvfs_peer_read_bytes_total``, ``kvfs_peer_misses_total`` (asked; it did not serve the
  block), ``kvfs_peer_errors_total`` (timeouts, refused connections),
  ``kvfs_peer_corrupt_total`` (blocks from it that failed their check),
  ``kvfs_peer_busy_total`` (reads given up: every landing buffer for it stayed in use
  until the deadline),
  ``kvfs_peer_served_total`` and ``kvfs_peer_served_bytes_total`` (what it read from this node)
- ``kvfs_peer_fetch_seconds`` (histogram of a read from it, buckets ``kvfs.stats.FETCH_BUCKETS``)

Whole store: ``kvfs_blocks``, ``kvfs_lookups_total``, ``kvfs_misses_total`` (reads with no
readable copy), ``kvfs_pending_writes``, ``kvfs_events_dropped_total``.

FUSE (label ``op``): ``kvfs_fuse_operations_total``, ``kvfs_fuse_errors_total``,
``kvfs_fuse_operation_seconds`` (histogram, buckets ``kvfs.mount.opstats.BUCKETS``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sized
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvfs.mount.opstats import BUCKETS, OpStats
from kvfs.stats import FETCH_BUCKETS, PeerStatistics
from kvfs.store import Store

__all__ = ["KvfsCollector", "make_registry", "start_metrics"]

log = logging.getLogger("kvfs.mount.metrics")

# (metric name without _total, TierStatistics field, help)
_TIER_COUNTERS = (
    ("kvfs_tier_hits", "hits", "Reads served from this tier."),
    ("kvfs_tier_read_bytes", "bytes_read", "Payload bytes read from this tier."),
    ("kvfs_tier_written_bytes", "bytes_written", "Payload bytes written into this tier."),
    ("kvfs_tier_stored", "stored", "Blocks sealed into this tier by a write."),
    ("kvfs_tier_promotions", "promotions", "Blocks copied into this tier from a colder one."),
    ("kvfs_tier_demotions", "demotions", "Blocks copied into this tier from a hotter one."),
    ("kvfs_tier_evictions", "evictions", "Copies dropped from this tier to make room or by request."),
    ("kvfs_tier_corrupt", "corrupt", "Copies in this tier that failed their checksum and were dropped."),
    ("kvfs_tier_errors", "errors", "Operations on this tier that failed (timeouts, backend errors)."),
)


class KvfsCollector(Collector):
    """Reads *store* and *opstats* (either may be None for a partial view) at each scrape;
    *inodes*, the mount's inode table, gives ``kvfs_fuse_inodes``."""

    def __init__(self, store: Store | None, opstats: OpStats | None = None, inodes: Sized | None = None) -> None:
        self.store = store
        self.opstats = opstats
        self.inodes = inodes

    def collect(self) -> Iterator[Metric]:
        if self.store is not None:
            yield from self._store_metrics(self.store)
        if self.opstats is not None:
            yield from self._op_metrics(self.opstats)
        if self.inodes is not None:
            yield GaugeMetricFamily(
                "kvfs_fuse_inodes",
                "Inodes the mount keeps for the kernel (at most max_inodes).",
                value=len(self.inodes),
            )

    def _store_metrics(self, store: Store) -> Iterator[Metric]:
        st = store.statistics()
        cap = GaugeMetricFamily(
            "kvfs_tier_capacity_bytes",
            "Capacity of the tier in bytes (absent when unbounded).",
            labels=["tier", "kind"],
        )
        used = GaugeMetricFamily(
            "kvfs_tier_used_bytes", "Bytes the tier's copies take against its capacity.", labels=["tier", "kind"]
        )
        blocks = GaugeMetricFamily("kvfs_tier_blocks", "Blocks with a copy in the tier.", labels=["tier", "kind"])
        healthy = GaugeMetricFamily(
            "kvfs_tier_healthy", "1 when the tier answers, 0 while it is marked unhealthy.", labels=["tier", "kind"]
        )
        misses = CounterMetricFamily(
            "kvfs_tier_misses",
            "Reads that missed every hotter tier and this one (lookups minus hits here and above).",
            labels=["tier"],
        )
        counters = {name: CounterMetricFamily(name, doc, labels=["tier"]) for name, _, doc in _TIER_COUNTERS}
        hits_above = 0
        for t in st.tiers:
            lk = [t.name, t.kind]
            if t.capacity is not None:
                cap.add_metric(lk, t.capacity)
            used.add_metric(lk, t.used)
            blocks.add_metric(lk, t.blocks)
            healthy.add_metric(lk, 1 if t.healthy else 0)
            for name, field, _ in _TIER_COUNTERS:
                counters[name].add_metric([t.name], getattr(t, field))
            hits_above += t.hits
            misses.add_metric([t.name], max(st.lookups - hits_above, 0))
        yield cap
        yield used
        yield blocks
        yield healthy
        yield misses
        yield from counters.values()
        yield from _peer_metrics(st.peers)
        yield from self._namespace_metrics(store)
        yield GaugeMetricFamily("kvfs_blocks", "Blocks in the namespace.", value=st.blocks)
        yield CounterMetricFamily("kvfs_lookups", "Block reads (opens) by name.", value=st.lookups)
        yield CounterMetricFamily("kvfs_misses", "Reads that found no readable copy in any tier.", value=st.misses)
        yield GaugeMetricFamily("kvfs_pending_writes", "Write-through copies queued.", value=st.pending_writes)
        yield CounterMetricFamily(
            "kvfs_events_dropped",
            "Block events dropped because nobody drained the queue.",
            value=store.events.dropped,
        )

    def _namespace_metrics(self, store: Store) -> Iterator[Metric]:
        spaces = store.namespace_statistics()
        if not spaces:
            return
        per_tier = ["namespace", "tier"]
        used = GaugeMetricFamily("kvfs_namespace_used_bytes", "Bytes the namespace's copies take.", labels=per_tier)
        quota = GaugeMetricFamily("kvfs_namespace_quota_bytes", "The namespace's quota in the tier.", labels=per_tier)
        copies = GaugeMetricFamily("kvfs_namespace_copies", "Copies of the namespace's blocks.", labels=per_tier)
        evictions = CounterMetricFamily(
            "kvfs_namespace_quota_evictions", "Copies evicted to keep the namespace within its quota.", labels=per_tier
        )
        blocks = GaugeMetricFamily("kvfs_namespace_blocks", "Blocks in the namespace.", labels=["namespace"])
        refused = CounterMetricFamily(
            "kvfs_namespace_refused", "Writes refused (ENOSPC) at the namespace's quotas.", labels=["namespace"]
        )
        expired = CounterMetricFamily(
            "kvfs_namespace_expired", "Blocks removed by retention or as retired.", labels=["namespace"]
        )
        for ns in spaces:
            for t, u, q, n, ev in ns.tiers:
                used.add_metric([ns.path, t], u)
                copies.add_metric([ns.path, t], n)
                evictions.add_metric([ns.path, t], ev)
                if q is not None:
                    quota.add_metric([ns.path, t], q)
            blocks.add_metric([ns.path], ns.blocks)
            refused.add_metric([ns.path], ns.refused)
            expired.add_metric([ns.path], ns.expired)
        yield from (used, quota, copies, evictions, blocks, refused, expired)

    def _op_metrics(self, opstats: OpStats) -> Iterator[Metric]:
        count = CounterMetricFamily("kvfs_fuse_operations", "FUSE operations handled.", labels=["op"])
        errors = CounterMetricFamily("kvfs_fuse_errors", "FUSE operations that returned an error.", labels=["op"])
        hist = HistogramMetricFamily("kvfs_fuse_operation_seconds", "Latency of FUSE operations.", labels=["op"])
        for s in opstats.snapshot():
            count.add_metric([s.op], s.count)
            errors.add_metric([s.op], s.errors)
            buckets = [(_le(b), c) for b, c in zip(BUCKETS, s.buckets)] + [("+Inf", s.buckets[-1])]
            hist.add_metric([s.op], buckets, s.total_seconds)
        yield count
        yield errors
        yield hist


# (metric name without _total, PeerStatistics field, help)
_PEER_COUNTERS = (
    ("kvfs_peer_hits", "hits", "Blocks read from the peer and published here."),
    ("kvfs_peer_read_bytes", "bytes_read", "Payload bytes read from the peer."),
    ("kvfs_peer_misses", "misses", "Blocks the peer was asked for and did not serve (no longer held, denied, busy)."),
    ("kvfs_peer_errors", "errors", "Reads from the peer that failed (timeouts, refused connections)."),
    ("kvfs_peer_corrupt", "corrupt", "Blocks from the peer whose bytes failed their check (never published)."),
    ("kvfs_peer_busy", "busy", "Reads from the peer given up: every landing buffer for it stayed in use."),
    ("kvfs_peer_served", "served", "Blocks the peer read from this node."),
    ("kvfs_peer_served_bytes", "bytes_served", "Payload bytes the peer read from this node."),
)


def _peer_metrics(peers: tuple[PeerStatistics, ...]) -> Iterator[Metric]:
    if not peers:
        return
    lk = ["peer"]
    healthy = GaugeMetricFamily("kvfs_peer_healthy", "1 while the peer may be asked, 0 while skipped.", labels=lk)
    blocks = GaugeMetricFamily("kvfs_peer_blocks", "Blocks the peer is known to hold (from its events).", labels=lk)
    counters = {name: CounterMetricFamily(name, doc, labels=lk) for name, _, doc in _PEER_COUNTERS}
    hist = HistogramMetricFamily("kvfs_peer_fetch_seconds", "Time of a read of a block from the peer.", labels=lk)
    for p in peers:
        healthy.add_metric([p.name], 1 if p.healthy else 0)
        blocks.add_metric([p.name], p.blocks)
        for name, field, _ in _PEER_COUNTERS:
            counters[name].add_metric([p.name], getattr(p, field))
        buckets = [(_le(b), c) for b, c in zip(FETCH_BUCKETS, p.fetch_buckets)] + [("+Inf", p.fetch_buckets[-1])]
        hist.add_metric([p.name], buckets, p.fetch_seconds)
    yield healthy
    yield blocks
    yield from counters.values()
    yield hist


def _le(bound: float) -> str:
    return repr(float(bound))


def make_registry(
    store: Store | None, opstats: OpStats | None = None, inodes: Sized | None = None
) -> CollectorRegistry:
    """A fresh registry holding only this mount's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KvfsCollector(store, opstats, inodes))
    return registry


def start_metrics(
    store: Store | None, opstats: OpStats | None, port: int, host: str = "127.0.0.1", inodes: Sized | None = None
) -> tuple[WSGIServer, int]:
    """Serve ``/metrics`` for *store* and *opstats* on *host*:*port* (0: any free port) in a
    daemon thread. Returns ``(server, port)``; ``server.shutdown()`` stops it (the daemon
    does so on unmount). Raises ``OSError`` when the port cannot be bound."""
    server, _thread = start_http_server(port, addr=host, registry=make_registry(store, opstats, inodes))
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return server, bound
