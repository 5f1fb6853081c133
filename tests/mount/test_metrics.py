"""Prometheus metrics over HTTP: the listed series exist and move as traffic flows, and
the Grafana dashboard queries only series that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from kvfs.blockfile import read_header
from kvfs.errors import BlockNotFound, TierUnavailable
from kvfs.mount.metrics import start_metrics
from kvfs.mount.opstats import OpStats

from support.control_harness import make_store
from support.metrics import scrape, tier

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


@pytest.fixture
def mount_metrics(tmp_path):
    store = make_store(tmp_path, dram=16 << 10)  # 4 blocks of 1000 bytes fit
    ops = OpStats()
    server, port = start_metrics(store, ops, 0)
    yield store, ops, port
    server.shutdown()
    server.server_close()
    store.close()


TIER_GAUGES = ["kvfs_tier_capacity_bytes", "kvfs_tier_used_bytes", "kvfs_tier_blocks", "kvfs_tier_healthy"]
TIER_COUNTERS = [
    "kvfs_tier_hits_total",
    "kvfs_tier_misses_total",
    "kvfs_tier_read_bytes_total",
    "kvfs_tier_written_bytes_total",
    "kvfs_tier_stored_total",
    "kvfs_tier_promotions_total",
    "kvfs_tier_demotions_total",
    "kvfs_tier_evictions_total",
    "kvfs_tier_corrupt_total",
    "kvfs_tier_errors_total",
]


def test_every_listed_series_is_served(mount_metrics):
    store, ops, port = mount_metrics
    ops.observe("read", 2e-4)
    m = scrape(port)
    for t, kind in (("dram", "dram"), ("disk", "disk")):
        for name in TIER_GAUGES:
            assert (name, (("kind", kind), ("tier", t))) in m, name
        for name in TIER_COUNTERS:
            assert (name, (("tier", t),)) in m, name
    for name in (
        "kvfs_blocks",
        "kvfs_lookups_total",
        "kvfs_misses_total",
        "kvfs_pending_writes",
        "kvfs_events_dropped_total",
    ):
        assert (name, ()) in m
    assert m[("kvfs_fuse_operations_total", (("op", "read"),))] == 1
    assert m[("kvfs_fuse_errors_total", (("op", "read"),))] == 0
    assert m[("kvfs_fuse_operation_seconds_bucket", (("le", "0.00025"), ("op", "read")))] == 1
    assert m[("kvfs_fuse_operation_seconds_bucket", (("le", "0.0001"), ("op", "read")))] == 0
    assert m[("kvfs_fuse_operation_seconds_count", (("op", "read"),))] == 1
    assert tier(m, "kvfs_tier_capacity_bytes", "dram", "dram") == 16 << 10
    assert tier(m, "kvfs_tier_healthy", "disk", "disk") == 1


def test_series_change_as_traffic_flows(mount_metrics, tmp_path):
    store, ops, port = mount_metrics
    before = scrape(port)

    for i in range(6):  # two more than DRAM holds: two demotions to disk
        store.put(f"m/{i}", bytes([i]) * 1000)
    store.read("m/5")
    store.read("m/0")  # from disk, promoted back into DRAM
    for _ in range(3):
        ops.observe("read", 3e-3)
    ops.observe("lookup", 1e-5, error=True)
    m = scrape(port)

    assert tier(m, "kvfs_tier_used_bytes", "dram", "dram") == 4 * 4096
    assert tier(m, "kvfs_tier_blocks", "disk", "disk") >= 2
    assert m[("kvfs_blocks", ())] == 6
    assert tier(m, "kvfs_tier_stored_total", "dram") == 6
    assert tier(m, "kvfs_tier_written_bytes_total", "dram") > tier(before, "kvfs_tier_written_bytes_total", "dram")
    assert tier(m, "kvfs_tier_demotions_total", "disk") >= 2
    assert tier(m, "kvfs_tier_evictions_total", "dram") >= 2
    assert tier(m, "kvfs_tier_hits_total", "dram") == 1
    assert tier(m, "kvfs_tier_hits_total", "disk") == 1
    assert tier(m, "kvfs_tier_misses_total", "dram") == 1  # m/0 missed DRAM, was found on disk
    assert tier(m, "kvfs_tier_misses_total", "disk") == 0
    assert tier(m, "kvfs_tier_read_bytes_total", "disk") == 1000
    assert tier(m, "kvfs_tier_promotions_total", "dram") == 1
    assert m[("kvfs_lookups_total", ())] == 2
    assert m[("kvfs_fuse_operations_total", (("op", "read"),))] == 3
    assert m[("kvfs_fuse_errors_total", (("op", "lookup"),))] == 1
    assert m[("kvfs_fuse_operation_seconds_sum", (("op", "read"),))] == pytest.approx(9e-3)

    # a corrupt copy on disk is dropped and counted when read
    victim = next(n for n in (f"m/{i}" for i in range(6)) if store.stat(n).tiers == ("disk",))
    f = tmp_path / "disk" / "blocks" / victim
    with open(f, "r+b") as fh:
        start = read_header(fh.fileno()).header_length  # 0 when the header is an attribute beside
        fh.seek(start)
        byte = fh.read(1)[0]
        fh.seek(start)
        fh.write(bytes([byte ^ 1]))
    with pytest.raises(BlockNotFound):  # the only copy was bad: a miss, never wrong bytes
        store.read(victim)
    # a failing tier is counted and shown unhealthy
    store.slots[1].failed(TierUnavailable("disk stalled"))  # what a timed-out call does
    m = scrape(port)
    assert tier(m, "kvfs_tier_corrupt_total", "disk") == 1
    assert m[("kvfs_misses_total", ())] == 1
    assert tier(m, "kvfs_tier_errors_total", "disk") == 1
    assert tier(m, "kvfs_tier_healthy", "disk", "disk") == 0


def test_each_mount_has_its_own_registry(tmp_path):
    a = make_store(tmp_path / "a")
    b = make_store(tmp_path / "b")
    sa, pa = start_metrics(a, None, 0)
    sb, pb = start_metrics(b, OpStats(), 0)
    try:
        a.put("x", b"1")
        assert scrape(pa)[("kvfs_blocks", ())] == 1
        assert scrape(pb)[("kvfs_blocks", ())] == 0
        assert not any(name.startswith("kvfs_") for name in REGISTRY._names_to_collectors)
    finally:
        for s in (sa, sb):
            s.shutdown()
            s.server_close()
        a.close()
        b.close()


def test_dashboard_queries_only_served_series(mount_metrics):
    store, ops, port = mount_metrics
    ops.observe("read", 1e-4)
    served = {name for name, _ in scrape(port)}
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    used = {n for e in exprs for n in re.findall(r"\bkvfs_[a-z_]+", e)}
    assert used - served == set()
    # the list: every family is on the dashboard
    for family in [
        "kvfs_tier_capacity_bytes",
        "kvfs_tier_used_bytes",
        "kvfs_tier_blocks",
        "kvfs_tier_hits_total",
        "kvfs_tier_misses_total",
        "kvfs_tier_read_bytes_total",
        "kvfs_tier_written_bytes_total",
        "kvfs_tier_promotions_total",
        "kvfs_tier_demotions_total",
        "kvfs_tier_evictions_total",
        "kvfs_tier_corrupt_total",
        "kvfs_tier_errors_total",
        "kvfs_tier_healthy",
        "kvfs_fuse_operation_seconds_bucket",
        "kvfs_fuse_operations_total",
    ]:
        assert family in used, family


def test_namespace_series(tmp_path):
    """Per namespace: use against quota per tier, quota evictions, refusals, blocks."""
    from kvfs.config import Config, DiskConfig, DramConfig, NamespaceConfig, PolicyConfig
    from kvfs.mount.assembly import open_store

    config = Config(
        tiers=(
            DramConfig(name="dram", capacity=64 << 10, mlock=False, prefault=False),
            DiskConfig(name="disk", capacity=16 << 20, path=tmp_path / "disk"),
        ),
        policy=PolicyConfig(eviction="lru"),
        namespaces=(NamespaceConfig(path="t", quota={"dram": 8 << 10}),),
    )
    store = open_store(config)
    server, port = start_metrics(store, None, 0)
    try:
        for i in range(3):  # two blocks of 4 KiB fit t's DRAM quota: one is evicted (to disk)
            store.put(f"t/{i}", bytes([i]) * 4096)
        m = scrape(port)
        ns = (("namespace", "t"), ("tier", "dram"))
        assert m[("kvfs_namespace_used_bytes", ns)] == 8 << 10
        assert m[("kvfs_namespace_quota_bytes", ns)] == 8 << 10
        assert ("kvfs_namespace_quota_bytes", (("namespace", "t"), ("tier", "disk"))) not in m
        assert m[("kvfs_namespace_quota_evictions_total", ns)] == 1
        assert m[("kvfs_namespace_copies", (("namespace", "t"), ("tier", "disk")))] == 1
        assert m[("kvfs_namespace_blocks", (("namespace", "t"),))] == 3
        assert m[("kvfs_namespace_refused_total", (("namespace", "t"),))] == 0
        assert m[("kvfs_namespace_expired_total", (("namespace", "t"),))] == 0
    finally:
        server.shutdown()
        server.server_close()
        store.close()
