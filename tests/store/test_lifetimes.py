"""Lifetimes with a fake clock: soft pins that expire, retention by last access (local
tiers, and a shared posix tier where a block another node published again is kept),
retired namespaces. docs/tenants.md, "Lifetimes"."""

from __future__ import annotations

import os
import random
import time

import pytest

from kvfs.blockfile import checksum
from kvfs.config import DiskConfig, DramConfig, NamespaceConfig, PolicyConfig, PosixConfig
from kvfs.errors import BlockNotFound
from kvfs.events import EventKind
from kvfs.names import TierName
from kvfs.store import Store
from kvfs.tiers.disk import DiskTier
from kvfs.tiers.dram import DramTier
from kvfs.tiers.posix import PosixTier

BLOCK = 64 << 10


class FakeClock:
    """Seconds that move only when the test says."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def blob(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


@pytest.fixture
def make_store(tmp_path):
    stores = []

    def make(clock, *, namespaces=(), dram_blocks=4, shared=False, disk="disk") -> Store:
        tiers = [
            DramTier(DramConfig(name=TierName("dram"), capacity=dram_blocks * BLOCK, mlock=False, prefault=False)),
            DiskTier(DiskConfig(name=TierName("disk"), capacity=64 << 20, path=tmp_path / disk)),
        ]
        if shared:
            tiers.append(PosixTier(PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=tmp_path / "shared")))
        s = Store(tiers, policy=PolicyConfig(eviction="lru"), clock=clock, namespaces=namespaces)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def test_a_soft_pin_ends_at_its_expiry(make_store):
    clock = FakeClock(1000.0)
    s = make_store(clock)
    s.put("a/1", blob(1))
    st = s.pin("a/1", ttl=60)
    assert st.pinned and st.pin_expires == 1060.0
    for i in range(2, 8):  # DRAM holds 4: a/1 stays while pinned
        s.put(f"a/{i}", blob(i))
    assert s.stat("a/1").tiers == ("dram",)
    clock.t = 1059.0
    assert s.sweep().unpinned == 0 and s.stat("a/1").pinned
    clock.t = 1060.0
    assert s.sweep().unpinned == 1
    st = s.stat("a/1")
    assert not st.pinned and st.pin_expires is None
    for i in range(8, 13):
        s.put(f"a/{i}", blob(i))
    assert s.stat("a/1").tiers == ("disk",)  # a candidate again: evicted (demoted) like the rest


def test_a_later_pin_or_unpin_wins_over_a_soft_pins_expiry(make_store):
    clock = FakeClock(0.0)
    s = make_store(clock)
    for name in ("hard", "again", "unpinned"):
        s.put(name, blob(len(name)))
        s.pin(name, ttl=10)
    s.pin("hard")  # a pin without expiry
    s.pin("again", ttl=100)  # a later soft pin
    s.pin("unpinned", False)
    clock.t = 50.0
    assert s.sweep().unpinned == 0
    assert s.stat("hard").pinned and s.stat("hard").pin_expires is None
    assert s.stat("again").pin_expires == 100.0 and not s.stat("unpinned").pinned
    clock.t = 100.0
    assert s.sweep().unpinned == 1 and not s.stat("again").pinned


def test_a_replaced_block_does_not_inherit_the_soft_pin(make_store):
    clock = FakeClock(0.0)
    s = make_store(clock)
    s.put("x", blob(1))
    s.pin("x", ttl=10)
    s.put("x", blob(2))
    assert not s.stat("x").pinned
    s.pin("x", ttl=20)
    clock.t = 10.0
    assert s.sweep().unpinned == 0 and s.stat("x").pinned  # the old record's expiry is not this one's


def test_retention_removes_blocks_not_read_for_longer_from_every_local_tier(make_store, tmp_path):
    clock = FakeClock(1000.0)
    s = make_store(clock, namespaces=(NamespaceConfig(path="t", retention=600.0),))
    for i in range(6):
        s.put(f"t/{i}", blob(i))  # 0 and 1 end on disk, 2-5 in DRAM
    s.put("other/x", blob(9))
    s.pin("t/5")
    clock.t = 1400.0
    s.read("t/0")  # read: its last access moves
    s.read("t/3")
    clock.t = 1700.0
    report = s.sweep()
    assert report.expired == 3  # t/1, t/2, t/4: not read for more than 600 s; t/5 is pinned
    assert sorted(b.name for b in s.walk("t")) == ["t/0", "t/3", "t/5"]
    assert sorted(os.listdir(tmp_path / "disk" / "blocks" / "t")) == sorted(
        b.name.split("/")[1] for b in s.walk("t") if "disk" in b.tiers
    )
    assert s.read("other/x") == blob(9)  # no retention outside the namespace
    removed = [e for e in s.events.drain() if e.kind is EventKind.REMOVED]
    assert {e.name for e in removed} == {"t/1", "t/2", "t/4"}
    assert all("retention of t" in e.detail for e in removed)
    [st] = s.namespace_statistics("t")
    assert st.expired == 3
    clock.t = 1701.0
    assert s.sweep().expired == 0  # the next pass waits retention / 20 = 30 s
    clock.t = 2100.0
    assert s.sweep().expired == 2  # t/0 and t/3 (read at 1400) now; t/5 is pinned
    assert [b.name for b in s.walk("t")] == ["t/5"]


def test_retention_set_at_runtime_applies_at_the_next_sweep(make_store):
    clock = FakeClock(0.0)
    s = make_store(clock)
    s.put("r/1", blob(1))
    clock.t = 100.0
    s.set_retention("r", 50.0)
    assert s.sweep().expired == 1
    with pytest.raises(BlockNotFound):
        s.stat("r/1")


def test_retention_on_a_shared_tier_keeps_a_copy_another_node_published_since(make_store, tmp_path):
    """Local copies go at the cutoff; the shared copy only if it was written before it."""
    real = time.time()
    clock = FakeClock(real - 7200)
    s = make_store(clock, namespaces=(NamespaceConfig(path="t", retention=600.0),), shared=True)
    s.put("t/old", blob(1))
    s.put("t/again", blob(2))
    assert s.run_pending() == 2  # written through to the shared tier
    shared = tmp_path / "shared" / "blocks" / "t"
    for f in os.listdir(shared):
        os.utime(shared / f, (real - 7200, real - 7200))
    clock.t = real - 60 + 600  # cutoff: a minute ago
    assert s.sweep().expired == 2
    other = PosixTier(PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=tmp_path / "shared"))
    try:  # another node publishes t/again now, before this node's deletes ran
        other.put("t/again", blob(2), checksum(blob(2)))
    finally:
        other.close()
    s.run_pending()
    assert os.listdir(shared) == ["again"]
    assert not (tmp_path / "disk" / "blocks" / "t").exists() or not os.listdir(tmp_path / "disk" / "blocks" / "t")
    clock.t += 3  # past the negative cache of the names this node removed
    assert s.read("t/again") == blob(2)  # found again in the shared tier
    with pytest.raises(BlockNotFound):
        s.read("t/old")


def test_a_retired_namespace_loses_its_local_copies_at_the_next_sweep(make_store):
    clock = FakeClock(0.0)
    s = make_store(clock, disk="d1")
    for i in range(3):
        s.put(f"old/{i}", blob(i))
    s.flush()
    s.close()
    s = make_store(clock, disk="d1", namespaces=(NamespaceConfig(path="old", retired=True),))
    assert len(s.walk("old")) == 3  # found at start
    report = s.sweep()
    assert report.retired == 3 and report.expired == 0
    assert s.walk("old") == []


def test_probe_many_with_a_shared_tier_finds_what_another_node_published(make_store, tmp_path):
    """With a shared tier a listing's probe asks it as a lookup would: a block only the
    shared tier holds (another node's) is found, a directory only it holds too."""
    s = make_store(FakeClock(time.time()), shared=True)
    s.put("p/here", blob(1))
    other = PosixTier(PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=tmp_path / "shared"))
    try:
        other.put("p/there", blob(2), checksum(blob(2)))
        other.put("p/q/deep", blob(3), checksum(blob(3)))
    finally:
        other.close()
    got = s.probe_many(["p/here", "p/there", "p/q", "p/none"])
    assert [d for d, _ in got] == [False, False, True, False]
    assert got[0][1] is not None and got[0][1].size == len(blob(1))
    assert got[1][1] is not None and got[1][1].checksum == checksum(blob(2))
    assert got[2][1] is None and got[3][1] is None
