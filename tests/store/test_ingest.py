"""The store side of the batch client, on real tiers (a shared-memory arena, a disk tier):

- two-phase puts (:mod:`kvfs.ingest`): a reserved extent counts against capacity, is
  invisible until committed, is committed only when its bytes match the writer's
  checksum, and is given back by abort, never by its deadline;
- batch probes and leases (:mod:`kvfs.batch`): presence of many names, the cached prefix,
  promotion per policy before a lease, per-name errors;
- a copy a reader outside the store found bad is re-checked and dropped.

The "client" here writes the arena through its own mapping of the arena file, as a
client process does.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from kvfs.blockfile import checksum
from kvfs.config import DiskConfig, PromoteMode
from kvfs.errors import (
    BlockCorrupt,
    BlockNotFound,
    InvalidName,
    IsADirectory,
    KvfsError,
    NoSpace,
    NotADirectory,
    ReservationEnded,
)
from kvfs.names import TierName
from kvfs.store import Store
from kvfs.tiers.disk import DiskTier

from support.stores import BLOCK, blob, make


class Arena:
    """A client's mapping of the arena file (read-write, as a write session has it)."""

    def __init__(self, store: Store) -> None:
        path = store.slots[0].tier.path
        fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(fd, os.fstat(fd).st_size)
        os.close(fd)

    def write(self, res, data: bytes) -> None:
        off = res.location.offset
        self.mm[off : off + len(data)] = data

    def read(self, location) -> bytes:
        return self.mm[location.offset : location.offset + location.length]


def used(store: Store, i: int = 0) -> int:
    return store.catalog.used[i] + store.slots[i].reserved


def test_a_reserved_extent_is_invisible_until_committed(tmp_path):
    s = make(tmp_path)
    arena = Arena(s)
    res = s.reserve("ns/a", BLOCK, parent="ns/root")
    assert s.slots[0].reserved == BLOCK and len(s.ingest) == 1
    arena.write(res, blob(1))
    assert not s.exists("ns/a")  # written, not committed: no reader sees it
    st = s.commit(res, checksum(blob(1)))
    assert st.tiers == ("dram",) and st.parent == "ns/root" and st.checksum == checksum(blob(1))
    assert s.read("ns/a") == blob(1) and s.slots[0].reserved == 0 and len(s.ingest) == 0
    assert s.slots[0].counters.stored == 1
    with pytest.raises(ReservationEnded, match="already committed"):
        s.commit(res, checksum(blob(1)))
    assert not s.abort(res)
    s.close()


def test_a_checksum_mismatch_aborts_and_publishes_nothing(tmp_path):
    s = make(tmp_path)
    arena = Arena(s)
    free = s.slots[0].tier.free_bytes
    res = s.reserve("a", BLOCK)
    arena.write(res, blob(1))
    with pytest.raises(BlockCorrupt, match="do not match the checksum the client sent"):
        s.commit(res, checksum(blob(2)))
    assert not s.exists("a") and s.slots[0].reserved == 0 and s.slots[0].tier.free_bytes == free
    assert res.state == "aborted"
    s.close()


def test_reservations_count_against_capacity_and_evict_by_policy(tmp_path):
    s = make(tmp_path, blocks=4)
    arena = Arena(s)
    for i in range(3):
        s.put(f"old{i}", blob(i))
    held = [s.reserve(f"new{i}", BLOCK) for i in range(3)]  # room is made: LRU blocks go to disk
    assert used(s) <= 4 * BLOCK
    assert [s.stat(f"old{i}").tiers for i in range(3)] == [("disk",), ("disk",), ("dram",)]
    s.pin("old2")
    with pytest.raises(NoSpace, match="has no room"):
        s.reserve("more", 2 * BLOCK)  # the rest is pinned or reserved
    with pytest.raises(NoSpace, match="larger than the whole dram tier"):
        s.reserve("huge", 5 * BLOCK)
    for i, r in enumerate(held):
        arena.write(r, blob(10 + i))
        s.commit(r, checksum(blob(10 + i)))
        assert used(s) <= 4 * BLOCK
    assert [s.read(f"new{i}") for i in range(3)] == [blob(10 + i) for i in range(3)]
    s.close()


def test_commit_replaces_the_old_version_while_its_reader_keeps_it(tmp_path):
    s = make(tmp_path)
    arena = Arena(s)
    s.put("a", blob(1))
    s.flush()  # the old version has a disk copy too: it must go
    assert s.stat("a").tiers == ("dram", "disk")
    ref = s.open("a")
    res = s.reserve("a", BLOCK // 2)
    arena.write(res, blob(2, BLOCK // 2))
    st = s.commit(res, checksum(blob(2, BLOCK // 2)))
    assert st.tiers == ("dram",) and st.size == BLOCK // 2
    assert bytes(ref.data) == blob(1)  # the reader of the old version keeps its bytes
    ref.release()
    assert s.read("a") == blob(2, BLOCK // 2) and not (tmp_path / "disk" / "blocks" / "a").exists()
    s.close()


def test_a_deadline_stops_the_commit_but_not_the_extent(tmp_path):
    now = [0.0]
    s = make(tmp_path, clock=lambda: now[0])
    arena = Arena(s)
    free = s.slots[0].tier.free_bytes
    res = s.reserve("a", BLOCK, ttl=5)
    arena.write(res, blob(1))
    now[0] = 6.0
    with pytest.raises(ReservationEnded, match="passed its deadline"):
        s.commit(res, checksum(blob(1)))
    # the writer may still hold a writable view: the extent is not reused until aborted
    assert s.slots[0].reserved == BLOCK and s.slots[0].tier.free_bytes == free - BLOCK
    assert s.abort(res) and s.slots[0].tier.free_bytes == free and s.slots[0].reserved == 0
    s.close()


def test_names_that_cannot_be_blocks_fail_at_reserve(tmp_path):
    s = make(tmp_path)
    s.put("dir/x", b"1")
    with pytest.raises(IsADirectory):
        s.reserve("dir", 10)
    with pytest.raises(NotADirectory, match="'dir/x' is a block"):
        s.reserve("dir/x/y", 10)
    with pytest.raises(InvalidName):
        s.reserve("../etc/passwd", 10)
    assert s.slots[0].reserved == 0
    s.close()


def test_a_store_without_an_arena_refuses_reservations(tmp_path):
    s = Store([DiskTier(DiskConfig(name=TierName("disk"), capacity=1 << 20, path=tmp_path / "d"))])
    with pytest.raises(KvfsError, match="client puts need a dram tier first"):
        s.reserve("a", 10)
    s.close()


def test_close_gives_reservations_back(tmp_path):
    s = make(tmp_path)
    s.reserve("a", BLOCK)
    s.close()  # nothing left open (the arena is gone with the store)


# -- probes and leases -------------------------------------------------------------------------


def test_probe_answers_many_names_and_the_cached_prefix(tmp_path):
    s = make(tmp_path, blocks=2)
    for i in range(3):
        s.put(f"c/{i}", blob(i))
    s.pin("c/2")
    p = s.probe(["c/0", "c/1", "/c//2", "c/9", "c/2"])
    assert p.sizes == [BLOCK, BLOCK, BLOCK, -1, BLOCK]
    assert p.tiers == [0b10, 0b01, 0b01, 0, 0b01]  # c/0 was demoted to disk (bit 1)
    assert p.pinned == [False, False, True, False, True] and p.prefix == 3
    assert s.probe([]).prefix == 0
    with pytest.raises(InvalidName):
        s.probe(["c/../x"])
    s.close()


def test_leases_follow_the_promote_policy(tmp_path):
    s = make(tmp_path, blocks=2, promote=PromoteMode.NEVER)
    for i in range(3):
        s.put(f"b{i}", blob(i))
    assert s.stat("b0").tiers == ("disk",)
    hits = s.stat("b0").hits
    [on_disk, missing, bad] = s.lease_many(["b0", "nope", "a/../b"], promote="policy")
    assert on_disk.tier == "disk" and on_disk.location.offset % 4096 == 0
    assert isinstance(missing, BlockNotFound) and isinstance(bad, InvalidName)
    with open(on_disk.location.path, "rb") as f:
        f.seek(on_disk.location.offset)
        assert f.read(on_disk.location.length) == blob(0)
    assert s.stat("b0").hits == hits + 1  # a leased read is a hit
    s.release(on_disk)
    [promoted] = s.lease_many(["b0"], promote="always")
    assert promoted.tier == "dram" and Arena(s).read(promoted.location) == blob(0)
    s.release(promoted)
    with pytest.raises(ValueError, match="promote must be one of"):
        s.lease_many(["b0"], promote="sometimes")
    s.close()


def test_a_batch_of_leases_holds_each_copy_it_names_and_counts_a_hit_per_lease(tmp_path):
    """``lease_many`` of DRAM copies, a disk copy, a miss and a bad name in one batch: each
    lease names the bytes of the version it holds (a DRAM block replaced while leased is
    leased anew at its new extent, the old lease keeps the old bytes), a hit is counted
    per lease taken (in the record and the tier), none with ``count_hits=False``."""
    s = make(tmp_path, blocks=3, promote=PromoteMode.NEVER)
    for i in range(4):
        s.put(f"b{i}", blob(i))  # b0 on disk, b1-b3 in DRAM
    assert s.stat("b0").tiers == ("disk",) and s.stat("b3").tiers == ("dram",)
    arena = Arena(s)
    hits = {n: s.stat(n).hits for n in ("b0", "b1", "b3")}
    dram_hits, disk_hits = s.slots[0].counters.hits, s.slots[1].counters.hits
    old = s.lease_many(["b3", "b0", "nope", "b1", "a/../b"], promote="never")
    assert [type(x).__name__ for x in old] == ["Lease", "Lease", "BlockNotFound", "Lease", "InvalidName"]
    b3, b0, _, b1, _ = old
    assert (b3.tier, b0.tier, b1.tier) == ("dram", "disk", "dram")
    assert arena.read(b3.location) == blob(3) and arena.read(b1.location) == blob(1)
    assert b3.location == s.slots[0].tier.locate("b3") and b3.checksum == checksum(blob(3))
    assert {n: s.stat(n).hits for n in hits} == {n: h + 1 for n, h in hits.items()}
    assert (s.slots[0].counters.hits, s.slots[1].counters.hits) == (dram_hits + 2, disk_hits + 1)
    s.put("b3", blob(9))  # replaced while leased: a new extent, the old one held
    [new] = s.lease_many(["b3"], count_hits=False)
    assert new.location != b3.location and arena.read(new.location) == blob(9)
    assert arena.read(b3.location) == blob(3)  # the old lease still holds the version it read
    assert s.stat("b3").hits == 0  # a new block, and a lease that counts no hit
    assert len(s.leases) == 4
    for lease in (*[x for x in old if hasattr(x, "id")], new):
        s.release(lease)
    assert len(s.leases) == 0
    s.close()


def test_leasing_in_nowait_defers_a_promotion_to_a_worker(tmp_path):
    from kvfs.errors import StoreBusy

    s = make(tmp_path, blocks=1)
    s.put("a", blob(1))
    s.put("b", blob(2))  # a on disk now
    before = len(s.leases)
    with pytest.raises(StoreBusy) as info:
        s.nowait(s.lease_many, ["b", "a"], promote="always")
    assert info.value.tier == 1 and len(s.leases) == before  # nothing was taken
    [lease] = s.nowait(s.lease_many, ["b"], promote="always")  # memory only: fine on the loop
    s.release(lease)
    s.close()


def test_a_copy_a_reader_found_bad_is_rechecked_and_dropped(tmp_path):
    s = make(tmp_path, blocks=1, promote=PromoteMode.NEVER)
    s.put("a", blob(1))
    s.put("b", blob(2))
    [lease] = s.lease_many(["a"])
    assert s.check_copy("a", "disk") is None  # it is good: nothing happens
    path = lease.location.path
    raw = bytearray(Path(path).read_bytes())
    raw[lease.location.offset + 100] ^= 1
    Path(path).write_bytes(raw)
    assert s.check_copy("a", "disk") == "a: payload checksum mismatch"
    assert not s.exists("a") and s.slots[1].counters.corrupt == 1
    assert os.path.exists(path)  # still leased: deleted when released
    s.release(lease)
    assert not os.path.exists(path)
    s.close()
