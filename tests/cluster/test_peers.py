"""The peer tier's core (kvfs.peers) and its config, without a network.

Two real stores (shared-memory arenas, disk tiers) stand for two nodes. The transport
between them is :class:`StoreSource`, which does in this process what NIXL does between
daemons: it leases the block on the serving store and copies its bytes into the asking
store's reserved extent through a mapping of that arena file, with faults on request
(flipped bytes, a timeout, a peer that cannot be reached, no landing buffer free). The real transport runs
in tests/cluster/test_peer_nixl.py (NIXL in this process) and tests/cluster/test_cluster.py (daemons in
network namespaces).
"""

from __future__ import annotations

import mmap
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvfs.config import ConfigError, DramConfig, PosixConfig, TierName, parse_config
from kvfs.errors import BlockNotFound, LandingBusy, StoreBusy, TierUnavailable
from kvfs.events import EventKind
from kvfs.hashing import block_hash_of
from kvfs.leases import Lease
from kvfs.peers import PEER_DETAIL, Incoming, Medium, PeerIndex, PeerReads, PeerSource
from kvfs.store import Store
from kvfs.tiers import open_tier
from kvfs.tiers.dram import DramTier

from support.stores import BLOCK, make

H = "ab" + "12" * 15  # a hashed basename: <ab>/<ab...>


def blob(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


def name_of(i: int) -> str:
    h = f"{i:02x}" + "cd" * 15
    return f"m/{h[:2]}/{h}"


@dataclass(kw_only=True, slots=True)
class Held(Incoming):
    lease: Lease


class StoreSource(PeerSource):
    """Serves *peer*'s blocks to *asker* in-process (see the module doc)."""

    def __init__(self, peers: dict[str, Store], asker: Store) -> None:
        self.peers = peers
        path = asker.slots[0].tier.path
        fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(fd, os.fstat(fd).st_size)
        os.close(fd)
        self.leases: dict[int, object] = {}
        self.fault: str | None = None
        self.calls = 0

    def fetch(self, peer: str, name: str, timeout: float) -> Incoming | None:
        self.calls += 1
        if self.fault == "down":
            raise TierUnavailable(f"peer {peer}: cannot connect")
        if self.fault == "busy":
            raise LandingBusy(f"every landing buffer for peer {peer} stayed in use for {timeout:g}s")
        [lease] = self.peers[peer].lease_many([name], promote="always", count_hits=False)
        if not isinstance(lease, Lease):
            return None
        self.leases[lease.id] = lease
        return Held(name=name, size=lease.size, checksum=lease.checksum, lease=lease)

    def read(self, peer: str, incoming: Incoming, offset: int, timeout: float) -> None:
        assert isinstance(incoming, Held)
        if self.fault == "timeout":
            raise TierUnavailable("the peer's write timed out")
        loc = incoming.lease.location
        with open(loc.path, "rb") as f:  # the serving arena file
            f.seek(loc.offset)
            data = bytearray(f.read(incoming.size))
        if self.fault == "flip":
            data[len(data) // 2] ^= 0x40
        self.mm[offset : offset + incoming.size] = data

    def release(self, peer: str, incoming: Incoming) -> None:
        assert isinstance(incoming, Held)
        lease = self.leases.pop(incoming.lease.id, None)
        if lease is not None:
            self.peers[peer].release(lease)


@pytest.fixture
def pair(tmp_path: Path):
    a = make(tmp_path / "a", blocks=16)
    b = make(tmp_path / "b", blocks=16)
    index = PeerIndex(["a"])
    source = StoreSource({"a": a}, b)
    b.elsewhere.peers = PeerReads(b.catalog, b.placement, b.ingest, index, source, timeout=1.0, retry_after=60.0)
    yield a, b, index, source
    b.close()
    a.close()


def _hold(a: Store, index: PeerIndex, i: int) -> str:
    name = name_of(i)
    a.put(name, blob(i))
    h = block_hash_of(name)
    assert h is not None
    index.stored("a", h, Medium.DRAM)
    return name


def test_a_block_only_a_peer_holds_is_read_checked_and_counted(pair):
    a, b, index, _ = pair
    name = _hold(a, index, 1)
    assert b.read(name) == blob(1)
    assert b.stat(name).tiers == ("dram",)
    [stats] = b.statistics().peers
    assert (stats.hits, stats.bytes_read, stats.healthy) == (1, BLOCK, True)
    assert len(a.leases) == 0  # the peer's copy was let go after the read


def test_a_block_read_from_a_peer_is_not_written_through_and_says_whence(pair):
    a, b, index, _ = pair
    name = _hold(a, index, 2)
    b.read(name)
    assert b.pending == 0
    stored = [e for e in b.events.drain() if e.kind is EventKind.STORED and e.name == name]
    assert [e.detail for e in stored] == [f"{PEER_DETAIL}a"]


def test_bytes_that_fail_the_check_are_never_published(pair):
    a, b, index, source = pair
    name = _hold(a, index, 3)
    source.fault = "flip"
    with pytest.raises(BlockNotFound):
        b.read(name)
    assert name not in b.catalog.blocks
    assert b.statistics().peers[0].corrupt == 1
    assert len(b.ingest) == 0  # the extent was given back
    source.fault = None
    assert b.read(name) == blob(3)


def test_a_peer_that_fails_costs_one_try_then_is_skipped(pair):
    a, b, index, source = pair
    first, second = _hold(a, index, 4), _hold(a, index, 5)
    source.fault = "down"
    with pytest.raises(BlockNotFound):
        b.read(first)
    with pytest.raises(BlockNotFound):
        b.read(second)
    assert source.calls == 1  # the second read did not ask the unhealthy peer
    [stats] = b.statistics().peers
    assert (stats.healthy, stats.errors) == (False, 1)


def test_a_timed_out_transfer_gives_its_extent_back(pair):
    a, b, index, source = pair
    name = _hold(a, index, 6)
    source.fault = "timeout"
    with pytest.raises(BlockNotFound):
        b.read(name)
    assert len(b.ingest) == 0 and b.slots[0].reserved == 0


def test_a_read_with_every_landing_buffer_busy_is_a_counted_miss_and_the_peer_stays_healthy(pair):
    a, b, index, source = pair
    name = _hold(a, index, 7)
    source.fault = "busy"
    with pytest.raises(BlockNotFound):
        b.read(name)
    [stats] = b.statistics().peers
    assert (stats.busy, stats.misses, stats.errors, stats.healthy, stats.hits) == (1, 0, 0, True, 0)
    assert len(b.ingest) == 0 and b.slots[0].reserved == 0
    source.fault = None
    assert b.read(name) == blob(7)  # the peer was not skipped


def test_a_stale_entry_costs_one_question_and_is_forgotten(pair):
    a, b, index, source = pair
    name = _hold(a, index, 8)
    a.delete(name)
    with pytest.raises(BlockNotFound):
        b.read(name)
    assert index.holders(block_hash_of(name)) == []
    assert b.statistics().peers[0].misses == 1


def test_the_read_that_fetches_a_block_asks_the_shared_tiers_nothing(tmp_path):
    """A peer's copy is as new as the shared tiers': its shared copies are learned on a
    use after the negative TTL, as any block's are revalidated, not by the fetching read."""
    now = [1000.0]
    shared = PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=tmp_path / "nfs")
    a, b = (
        Store(
            [
                DramTier(DramConfig(name=TierName("dram"), capacity=16 * BLOCK, mlock=False, prefault=False)),
                open_tier(shared),
            ],
            clock=lambda: now[0],
            negative_ttl=2.0,
        )
        for _ in range(2)
    )
    try:
        index = PeerIndex(["a"])
        b.elsewhere.peers = PeerReads(b.catalog, b.placement, b.ingest, index, StoreSource({"a": a}, b), timeout=1.0)
        name = _hold(a, index, 11)
        a.run_pending()  # written through: the shared tier holds it too
        assert b.read(name) == blob(11)
        rec = b.catalog.get(name)
        assert rec.tiers == b.slots[0].bit and rec.learn_shared
        assert not b.records.due(rec)  # no question to the shared tier with the read
        assert b.statistics().tiers[1].hits == 0
        now[0] += 2.5
        assert b.records.due(rec)
        b.records.refresh(name)  # the next use: revalidated in the background
        deadline = time.monotonic() + 60
        while not rec.tiers & b.slots[1].bit and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.stat(name).tiers == ("dram", "nfs") and not rec.learn_shared
    finally:
        b.close()
        a.close()


def test_a_block_written_here_wins_over_the_peer_copy(pair):
    a, b, index, source = pair
    name = _hold(a, index, 9)
    b.put(name, b"mine")
    assert b.read(name) == b"mine"
    assert source.calls == 0


def test_on_an_event_loop_a_peer_read_is_sent_to_a_worker(pair):
    a, b, index, _ = pair
    name = _hold(a, index, 10)
    with pytest.raises(StoreBusy) as exc:
        b.nowait(b.lookup, name)
    assert exc.value.tier == 0
    assert b.lookup(name) is not None


def test_the_index_keeps_dram_holders_first_and_forgets_a_cleared_peer():
    index = PeerIndex(["a", "b"], max_entries=2)
    h = bytes.fromhex(H)
    index.stored("a", h, Medium.DISK)
    index.stored("b", h, Medium.DRAM)
    assert index.holders(h) == ["b", "a"]
    index.removed("b", h, Medium.DRAM)
    assert index.holders(h) == ["a"]
    index.stored("a", b"x", Medium.DRAM)
    index.stored("a", b"y", Medium.DRAM)  # over max_entries: not learned
    assert index.dropped == 1 and index.holders(b"y") == []
    index.cleared("a")
    assert index.holders(h) == [] and index.count("a") == 0


def test_block_hash_of_follows_the_naming_layout():
    assert block_hash_of(f"m/ab/{H}") == bytes.fromhex(H)
    assert block_hash_of(f"m/cd/{H}") is None  # the folder is the hash's first two digits
    assert block_hash_of("m/weights.safetensors") is None


BASE = {"tiers": [{"kind": "dram", "capacity": "64MiB"}, {"kind": "disk", "capacity": "1GiB", "path": "/tmp/x"}]}


def _cluster(**kw):
    table = {"node": "a", "listen": "10.0.0.1:7470", "peers": [{"name": "b", "address": "10.0.0.2:7470"}], **kw}
    return parse_config({**BASE, "cluster": table})


def test_cluster_config_parses():
    c = _cluster(timeout="500ms", ucx_tls="tcp", landing="256KiB").cluster
    assert c is not None
    assert (c.node, c.host, c.port, c.timeout, c.ucx_tls, c.landing) == ("a", "10.0.0.1", 7470, 0.5, "tcp", 256 << 10)
    assert c.peers[0].name == "b" and c.peers[0].port == 7470
    assert parse_config(BASE).cluster is None


@pytest.mark.parametrize(
    ("table", "field", "says"),
    [
        ({"node": None}, "cluster.node", "missing required key"),
        ({"listen": "10.0.0.1"}, "cluster.listen", "host:port"),
        ({"listen": "10.0.0.1:99999"}, "cluster.listen", "port from 1 to 65535"),
        ({"timeout": "0s"}, "cluster.timeout", "more than 0"),
        ({"max_connections": 0}, "cluster.max_connections", "from 1 to 1024"),
        ({"landing": "4KiB"}, "cluster.landing", "from 64KiB to 1GiB"),
        ({"max_in_flight": "64MiB"}, "cluster.max_in_flight", "unknown key"),
        ({"peers": [{"name": "a", "address": "10.0.0.2:1"}]}, "cluster.peers[0].name", "this node's own name"),
        (
            {"peers": [{"name": "b", "address": "10.0.0.2:1"}, {"name": "b", "address": "10.0.0.3:1"}]},
            "cluster.peers[1].name",
            "used twice",
        ),
        ({"peers": [{"name": "b"}]}, "cluster.peers[0].address", "missing required key"),
        ({"peers": [{"name": "b", "address": "x:1", "events": "x:1"}]}, "cluster.peers[0].events", "ZMQ address"),
        ({"peers": [{"name": "b", "address": "x:1", "color": 1}]}, "cluster.peers[0].color", "unknown key"),
        ({"gossip": True}, "cluster.gossip", "unknown key"),
    ],
)
def test_cluster_config_errors_name_the_field(table, field, says):
    raw = {"node": "a", "listen": "10.0.0.1:7470", **table}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError) as exc:
        parse_config({**BASE, "cluster": raw})
    assert exc.value.field == field
    assert says in exc.value.reason


def test_a_cluster_needs_a_dram_tier_first():
    with pytest.raises(ConfigError) as exc:
        parse_config(
            {
                "tiers": [{"kind": "disk", "capacity": "1GiB", "path": "/tmp/x"}],
                "cluster": {"node": "a", "listen": "1.2.3.4:5"},
            }
        )
    assert exc.value.field == "cluster" and "dram" in exc.value.reason
