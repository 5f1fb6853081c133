"""The store over real DRAM (shared memory) and disk tiers: placement, eviction order,
pins, demotion and promotion, restart, corruption, capacity."""

from __future__ import annotations

import os
import random
import threading

import pytest

from kvfs.blockfile import align_up
from kvfs.config import DiskConfig, DramConfig, PolicyConfig, PromoteMode, WriteMode
from kvfs.errors import BlockNotFound, IsADirectory, LastCopy, NoSpace, NotADirectory, Pinned
from kvfs.events import EventKind
from kvfs.names import TierName
from kvfs.pieces import Pieces
from kvfs.store import Store
from kvfs.tiers.disk import DiskTier
from kvfs.tiers.dram import DramTier

from support.deadlines import DEADLINE
from support.stores import Clock

BLOCK = 64 << 10  # 64 KiB blocks: the DRAM tier below holds exactly four


@pytest.fixture
def make_store(tmp_path):
    stores: list[Store] = []

    def make(
        *,
        dram_blocks=4,
        disk_bytes=64 << 20,
        eviction="lru",
        promote=PromoteMode.ALWAYS,
        disk_write=WriteMode.BACK,
        tiers=("dram", "disk"),
    ) -> Store:
        built = []
        if "dram" in tiers:
            built.append(DramTier(DramConfig(name=TierName("dram"), capacity=dram_blocks * BLOCK)))
        if "disk" in tiers:
            built.append(
                DiskTier(
                    DiskConfig(name=TierName("disk"), capacity=disk_bytes, path=tmp_path / "disk", write=disk_write)
                )
            )
        s = Store(built, policy=PolicyConfig(eviction=eviction, promote=promote), clock=Clock())
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def blob(i: int, size: int = BLOCK) -> bytes:
    return random.Random(i).randbytes(size)


def tiers_of(store: Store) -> dict[str, tuple[str, ...]]:
    return {b.name: b.tiers for b in store.walk()}


def moves(store: Store) -> list[tuple[str, str, str | None]]:
    return [(e.kind.value, e.name, e.tier) for e in store.events.drain() if e.kind is not EventKind.STORED]


def test_put_read_roundtrip(make_store):
    s = make_store()
    s.put("ns/ab/x", blob(1))
    assert s.read("ns/ab/x") == blob(1)
    st = s.stat("ns/ab/x")
    assert st.size == BLOCK and st.tiers == ("dram",) and not st.pinned
    assert s.listdir("ns") == {"ab": True}
    assert s.listdir("ns/ab") == {"x": False}
    out = bytearray(BLOCK + 10)
    assert s.read_into("ns/ab/x", out) == BLOCK and out[:BLOCK] == blob(1)


@pytest.mark.parametrize("tiers", [("dram", "disk"), ("disk",)])
def test_put_from_pieces_seals_the_joined_bytes(make_store, tiers):
    """A block sealed from pieces (the mount's chunks, not joined) has the checksum, the
    bytes and the copies of the same block sealed joined, in every tier it reaches."""
    s = make_store(tiers=tiers, disk_write=WriteMode.THROUGH)
    parts = [blob(2, BLOCK // 2), bytes(1000), blob(3, 4097)[1:], b"", b"z"]
    joined = b"".join(parts)
    a = s.put("ns/a", Pieces(parts))
    b = s.put("ns/b", joined)
    s.run_pending()  # the write-through copy to disk
    assert a.checksum == b.checksum and a.size == b.size == len(joined)
    assert tiers_of(s)["ns/a"] == tiers_of(s)["ns/b"] == tiers
    assert s.read("ns/a") == s.read("ns/b") == joined
    if "dram" in tiers:
        s.evict("ns/a", tier="dram")
        assert s.read("ns/a") == joined  # the disk copy, checked against the checksum


def test_lru_eviction_order(make_store):
    s = make_store(eviction="lru")
    for i in range(4):
        s.put(f"b{i}", blob(i))
    s.events.drain()
    s.read("b0")
    s.put("b4", blob(4))
    s.put("b5", blob(5))
    assert moves(s) == [
        ("demoted", "b1", "disk"),
        ("evicted", "b1", "dram"),
        ("demoted", "b2", "disk"),
        ("evicted", "b2", "dram"),
    ]
    assert tiers_of(s) == {
        "b0": ("dram",),
        "b1": ("disk",),
        "b2": ("disk",),
        "b3": ("dram",),
        "b4": ("dram",),
        "b5": ("dram",),
    }


def test_lfu_eviction_order(make_store):
    s = make_store(eviction="lfu")
    for i in range(4):
        s.put(f"b{i}", blob(i))
    for name, n in (("b0", 3), ("b1", 2), ("b3", 1)):
        for _ in range(n):
            s.read(name)
    s.events.drain()
    s.put("b4", blob(4))  # b2 has the fewest accesses
    s.put("b5", blob(5))  # then b4 (one access) goes before b3 (two)
    assert moves(s) == [
        ("demoted", "b2", "disk"),
        ("evicted", "b2", "dram"),
        ("demoted", "b4", "disk"),
        ("evicted", "b4", "dram"),
    ]


def test_promotion_on_read_and_never(make_store):
    s = make_store()
    for i in range(5):
        s.put(f"b{i}", blob(i))
    assert s.stat("b0").tiers == ("disk",)
    assert s.read("b0") == blob(0)
    assert s.stat("b0").tiers == ("dram", "disk")  # promoted; the disk copy stays
    assert s.stat("b1").tiers == ("disk",)  # b1 made room


def test_no_promotion_when_never(make_store):
    s = make_store(promote=PromoteMode.NEVER)
    for i in range(5):
        s.put(f"b{i}", blob(i))
    assert s.read("b0") == blob(0)
    assert s.stat("b0").tiers == ("disk",)


def test_second_hit_promotion(make_store):
    s = make_store(promote=PromoteMode.SECOND_HIT)
    for i in range(5):
        s.put(f"b{i}", blob(i))
    s.read("b0")
    assert s.stat("b0").tiers == ("disk",)
    s.read("b0")
    assert s.stat("b0").tiers == ("dram", "disk")


def test_pinned_blocks_stay(make_store):
    s = make_store()
    for i in range(4):
        s.put(f"p{i}", blob(i))
    s.pin("p0")
    s.pin("p2")
    for i in range(4, 10):
        s.put(f"b{i}", blob(i))
    t = tiers_of(s)
    assert t["p0"] == ("dram",) and t["p2"] == ("dram",)
    assert s.stat("p0").pinned
    s.pin("p0", False)
    s.put("b10", blob(10))  # unpinning re-inserts p0 as most recently used: b8 goes first,
    s.put("b11", blob(11))  # then b9,
    assert tiers_of(s)["p0"] == ("dram",)
    s.put("b12", blob(12))  # then p0, evictable again
    assert tiers_of(s)["p0"] == ("disk",)


def test_all_pinned_spills_then_no_space(make_store):
    s = make_store(tiers=("dram",))
    for i in range(4):
        s.put(f"p{i}", blob(i))
        s.pin(f"p{i}")
    with pytest.raises(NoSpace, match="every tier is full of pinned blocks or too small; unpin blocks or add capacity"):
        s.put("x", blob(9))
    assert not s.exists("x")
    assert all(s.read(f"p{i}") == blob(i) for i in range(4))
    s2 = make_store(dram_blocks=2, disk_bytes=4 * BLOCK)
    s2.put("a", blob(1))
    s2.pin("a")
    s2.put("b", blob(2))
    s2.pin("b")
    s2.put("c", blob(3))  # DRAM holds only pinned blocks: the write lands on disk
    assert s2.stat("c").tiers == ("disk",)


def test_block_larger_than_a_tier_skips_it(make_store):
    s = make_store(dram_blocks=1)
    s.put("big", blob(1, 3 * BLOCK))
    assert s.stat("big").tiers == ("disk",)
    assert s.read("big") == blob(1, 3 * BLOCK)


def test_writes_beyond_all_capacity_drop_least_valuable(make_store):
    s = make_store(dram_blocks=2, disk_bytes=3 * (BLOCK + 4096))
    for i in range(8):
        s.put(f"b{i}", blob(i))
    names = set(tiers_of(s))
    assert names == {"b3", "b4", "b5", "b6", "b7"}
    with pytest.raises(BlockNotFound):
        s.read("b0")
    removed = [e.name for e in s.events.drain() if e.kind is EventKind.REMOVED]
    assert removed == ["b0", "b1", "b2"]


def test_restart_sees_every_block(make_store, tmp_path):
    s = make_store()
    data = {f"ns/{i % 3}/b{i}": blob(i, 1000 + 777 * i) for i in range(12)}
    for n, d in data.items():
        s.put(n, d)
    assert s.flush() > 0
    s.close()
    s2 = make_store()
    assert sorted(s2) == sorted(data)
    for n, d in data.items():
        assert s2.read(n) == d
        assert s2.stat(n).size == len(d)


def test_flipped_byte_on_disk_is_never_returned(make_store, tmp_path):
    s = make_store()
    for i in range(5):
        s.put(f"b{i}", blob(i))
    path = tmp_path / "disk" / "blocks" / "b0"
    raw = bytearray(path.read_bytes())
    raw[4096 + 100] ^= 0x01
    path.write_bytes(raw)
    with pytest.raises(BlockNotFound):
        s.read("b0")
    st = s.statistics()
    assert st.tiers[1].corrupt == 1
    assert not s.exists("b0")
    assert not path.exists()
    kinds = [(e.kind, e.name) for e in s.events.drain() if e.name == "b0"]
    assert (EventKind.CORRUPT, "b0") in kinds and kinds[-1] == (EventKind.REMOVED, "b0")


def test_corrupt_disk_copy_falls_back_to_dram(make_store, tmp_path):
    s = make_store(disk_write=WriteMode.THROUGH)
    s.put("x", blob(1))
    assert s.run_pending() == 1
    assert s.stat("x").tiers == ("dram", "disk")
    path = tmp_path / "disk" / "blocks" / "x"
    raw = bytearray(path.read_bytes())
    raw[-1 - (4096 - BLOCK % 4096) % 4096 - 5] ^= 0xFF
    path.write_bytes(raw)
    assert s.read("x") == blob(1)  # served from DRAM, the good copy
    s.evict("x", "dram")  # the (bad) disk copy is now the only one
    with pytest.raises(BlockNotFound):
        s.read("x")
    assert s.statistics().tiers[1].corrupt == 1


def test_capacity_respected_at_all_times(make_store, tmp_path):
    s = make_store(dram_blocks=6, disk_bytes=24 * BLOCK)
    rng = random.Random(7)
    caps = [t.capacity for t in s.tiers]
    for step in range(300):
        name = f"n/{rng.randrange(60)}"
        op = rng.random()
        if op < 0.5:
            s.put(name, rng.randbytes(rng.choice([1, 5000, BLOCK, 2 * BLOCK + 3])))
        elif op < 0.8:
            try:
                s.read(name)
            except BlockNotFound:
                pass
        elif op < 0.9:
            try:
                s.delete(name)
            except BlockNotFound:
                pass
        else:
            try:
                s.pin(name, rng.random() < 0.3)
            except BlockNotFound:
                pass
        st = s.statistics()
        for t, cap in zip(st.tiers, caps):
            assert t.used <= cap, (step, t)
        d = tmp_path / "disk" / "blocks" / "n"
        # what the files take, 4 KiB pages (the payload alone, its header an attribute beside it)
        on_disk = sum(align_up(e.stat().st_size) for e in os.scandir(d)) if d.exists() else 0
        assert on_disk == st.tiers[1].used <= caps[1]


def test_replace_and_old_readers(make_store):
    s = make_store()
    s.put("r", blob(1))
    ref = s.open("r")
    s.put("r", blob(2))
    assert s.read("r") == blob(2)
    assert bytes(ref.data) == blob(1)
    ref.release()


def test_write_through_and_flush(make_store):
    s = make_store(disk_write=WriteMode.THROUGH)
    s.put("w", blob(1))
    assert s.pending == 1 and s.stat("w").tiers == ("dram",)
    assert s.run_pending() == 1
    assert s.stat("w").tiers == ("dram", "disk")
    assert s.pending == 0


def test_flush_writes_dram_only_blocks(make_store):
    s = make_store()
    for i in range(3):
        s.put(f"b{i}", blob(i))
    assert s.flush() == 3
    assert all(s.stat(f"b{i}").tiers == ("dram", "disk") for i in range(3))
    assert s.flush() == 0


def test_evict_never_drops_last_copy_unless_forced(make_store):
    s = make_store(tiers=("dram",))
    s.put("x", blob(1))
    with pytest.raises(LastCopy, match="use --force"):
        s.evict("x")
    assert s.evict("x", force=True) is None
    assert not s.exists("x")
    s2 = make_store()
    s2.put("y", blob(2))
    st = s2.evict("y", "dram")
    assert st.tiers == ("disk",)  # demoted first, then dropped from DRAM
    assert s2.read("y") == blob(2)


def test_prefetch(make_store):
    s = make_store()
    for i in range(5):
        s.put(f"b{i}", blob(i))
    assert s.stat("b0").tiers == ("disk",)
    assert s.prefetch("b0").tiers == ("dram", "disk")
    assert s.stat("b0").hits == 0  # a prefetch is not a hit


def test_delete_and_rename(make_store, tmp_path):
    s = make_store()
    for i in range(5):
        s.put(f"d/b{i}", blob(i))
    s.delete("d/b0")  # on disk only
    assert not (tmp_path / "disk" / "blocks" / "d" / "b0").exists()
    with pytest.raises(BlockNotFound):
        s.delete("d/b0")
    s.put("tmp/x.tmp", blob(9))
    s.rename("tmp/x.tmp", "d/b1")  # replaces the disk copy of d/b1
    assert s.read("d/b1") == blob(9)
    assert not (tmp_path / "disk" / "blocks" / "d" / "b1").exists()
    assert s.listdir("tmp") == {}
    s.flush()
    s.close()
    s2 = make_store()
    assert s2.read("d/b1") == blob(9)
    assert "tmp/x.tmp" not in set(s2)


def test_names_and_directories(make_store):
    s = make_store()
    s.put("a/b", b"1")
    with pytest.raises(NotADirectory):
        s.put("a/b/c", b"2")
    with pytest.raises(IsADirectory):
        s.put("a", b"3")
    s.mkdir("e/f", parents=True)
    assert s.listdir("e") == {"f": True}
    s.rmdir("e/f")
    assert s.listdir("e") == {}


def test_concurrent_writers_and_readers(make_store):
    s = make_store(dram_blocks=8)
    names = [f"c/{i}" for i in range(16)]
    versions = {n: {blob(hash((n, v)) & 0xFFFF) for v in range(3)} for n in names}
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            n = rng.choice(names)
            if rng.random() < 0.4:
                s.put(n, rng.choice(sorted(versions[n])))
            else:
                try:
                    if s.read(n) not in versions[n]:
                        errors.append(n)
                except BlockNotFound:
                    pass

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for n in s:
        assert s.read(n) in versions[n]


def test_stale_arenas_of_dead_daemons_are_removed(tmp_path):
    import subprocess
    import sys

    from kvfs.tiers.dram import remove_stale_arenas

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    stale = tmp_path / f"kvfs-{int(dead.stdout)}-0123abcd"
    live = tmp_path / f"kvfs-{os.getpid()}-89abcdef"
    other = tmp_path / "kvfs-not-an-arena"
    for p in (stale, live, other):
        p.write_bytes(b"x")
    assert remove_stale_arenas(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other.exists()


def test_nowait_calls_never_wait_for_a_busy_store(make_store):
    from kvfs.store import StoreBusy

    s = make_store()
    for i in range(5):
        s.put(f"b{i}", blob(i))  # b0 ends up on disk only
    held, release = threading.Event(), threading.Event()

    def placement_in_progress():  # stands for a put that is demoting a block to disk
        with s.placement.lock:
            held.set()
            release.wait(DEADLINE)  # until the test is done with it, however slow the machine

    t = threading.Thread(target=placement_in_progress)
    t.start()
    assert held.wait(DEADLINE)
    try:
        with pytest.raises(StoreBusy):
            s.nowait(s.lookup, "b4")
        assert s.open_hot("b4") is None
    finally:
        release.set()
        t.join()
    assert s.nowait(s.lookup, "b4").tiers == ("dram",)
    hits = s.stat("b4").hits
    with s.open_hot("b4") as ref:
        assert bytes(ref.data) == blob(4)
    assert s.stat("b4").hits == hits + 1
    assert s.open_hot("b0") is None  # its hottest copy is on disk: that read belongs in a thread


def _walked_usage(s: Store, directory: str):
    recs = s.walk(directory)
    per_tier = []
    for i, t in enumerate(s.tiers):
        held = [r for r in recs if t.name in r.tiers]
        per_tier.append((t.name, sum(t.footprint(r.name, r.size) for r in held), len(held)))
    return tuple(per_tier), len(recs), sum(r.size for r in recs)


def test_directory_totals_match_a_walk_through_every_change(make_store):
    s = make_store(dram_blocks=6, disk_bytes=20 * BLOCK)
    rng = random.Random(3)
    dirs = ["a/x", "a/y", "b"]
    names = [f"{d}/{i}" for d in dirs for i in range(8)]
    for step in range(250):
        name = rng.choice(names)
        op = rng.random()
        try:
            if op < 0.4:
                s.put(name, rng.randbytes(rng.choice([10, 5000, BLOCK])))
            elif op < 0.55:
                s.read(name)
            elif op < 0.65:
                s.delete(name)
            elif op < 0.75:
                s.rename(name, rng.choice(names))
            elif op < 0.85:
                s.evict(name, "dram")
            else:
                s.pin(name, rng.random() < 0.5)
        except (BlockNotFound, LastCopy, NoSpace, Pinned):
            pass
        for d in ("", "a", "a/x", "a/y", "b"):
            if not s.is_dir(d):
                continue
            u = s.usage(d)
            assert (u.tiers, u.blocks, u.size) == _walked_usage(s, d), (step, d)


def test_probe_many_answers_as_is_dir_then_lookup(make_store):
    """A listing's entries probed under one hold of the lock: directories, blocks of each
    size, missing names and unnormalized spellings, the same answers as one call each."""
    s = make_store(dram_blocks=8)
    s.mkdir("d/sub", parents=True)
    for i in range(5):
        s.put(f"d/b{i}", blob(i, 1000 * i))
    names = ["d/sub", "d/b0", "d/b3", "d/missing", "/d//b4", "d", "d/sub/none"]
    got = s.probe_many(names)
    assert [d for d, _ in got] == [s.is_dir(n) for n in names] == [True, False, False, False, False, True, False]
    stats = [None if s.is_dir(n) else s.lookup(n) for n in names]
    want = [None if st is None else (st.size, st.checksum, st.created) for st in stats]
    assert [None if i is None else tuple(i) for _, i in got] == want
    assert got[2][1] is not None and got[2][1].size == 3000
    assert s.probe_many([]) == []
