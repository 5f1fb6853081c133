"""The store's collaborators and its two-phase moves, on real tiers.

- each collaborator (slot, placement, shared view, write-through queue, health breaker,
  deadline executor, lease table) is built and used on its own;
- no tier I/O under the store's lock: a DRAM hit completes while a demotion is stuck in a
  disk tier that stopped answering (a real stalling FUSE filesystem, tools/stallfs.py);
- the flush before unmount never drops a block's last copy to make room, and says which
  blocks it could not write down;
- leases keep a DRAM extent and a disk file from being reused, replaced or removed;
- rebuild treats a header naming ``../../x`` as a corrupt file and never moves it;
- fsync is a per-tier choice;
- revalidation against shared tiers runs in the background; a bad local copy after a
  restart falls to a good shared one on the first read; mkdir under a directory only
  another node made works.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from kvfs.backlog import CopyJob, DeleteJob, WriteThroughQueue
from kvfs.blockfile import checksum, encode_header
from kvfs.catalog import BlockRecord, Catalog
from kvfs.config import DiskConfig, DramConfig, PolicyConfig, PosixConfig, PromoteMode
from kvfs.deadline import DeadlineExecutor
from kvfs.errors import BlockNotFound, InvalidName, TierUnavailable
from kvfs.events import EventKind, EventLog
from kvfs.health import HealthBreaker
from kvfs.leases import Leases
from kvfs.names import TierName
from kvfs.placement import Placement
from kvfs.policies import Hint
from kvfs.policies.lru import LRU
from kvfs.shared import SharedView
from kvfs.slot import TierSlot
from kvfs.store import Store
from kvfs.tiers.disk import DiskTier
from kvfs.tiers.dram import DramTier
from kvfs.tiers.posix import PosixTier

from support.deadlines import DEADLINE, TIER_TIMEOUT, wait_for
from support.mounts import fuse_missing

BLOCK = 64 << 10


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def blob(i: int, size: int = BLOCK) -> bytes:
    return random.Random(i).randbytes(size)


def dram(blocks: int = 4) -> DramTier:
    return DramTier(DramConfig(name=TierName("dram"), capacity=blocks * BLOCK, mlock=False, prefault=False))


def disk(path: Path, capacity: int = 64 << 20, **kw) -> DiskTier:
    return DiskTier(DiskConfig(name=TierName("disk"), capacity=capacity, path=path, **kw))


def posix(path: Path, **kw) -> PosixTier:
    kw.setdefault("timeout", TIER_TIMEOUT)
    return PosixTier(PosixConfig(name=TierName("posix"), capacity=1 << 30, path=path, **kw))


# -- each collaborator on its own ----------------------------------------------------------


def test_health_breaker_opens_and_half_opens():
    clock = Clock()
    h = HealthBreaker("t", clock=clock, retry_after=5.0)
    assert h.usable() and h.healthy
    h.failed(TierUnavailable("down"))
    assert not h.healthy and not h.usable() and h.errors == 1
    clock.now += 5.0
    assert h.usable() and not h.healthy  # half-open: this thread probes...
    others: list[bool] = []
    t = threading.Thread(target=lambda: others.append(h.usable()))
    t.start()
    t.join()
    assert others == [False] and h.usable()  # ...and the others keep skipping it meanwhile
    h.answered()
    assert h.healthy


def test_deadline_executor_abandons_and_never_joins():
    ex = DeadlineExecutor("stuck", timeout=0.2, workers=1)
    gate = threading.Event()
    released = []
    with pytest.raises(TierUnavailable, match="timed out"):  # the call waits for the gate: always late
        ex.call(lambda: (gate.wait(), "result")[1], on_abandon=released.append)
    gate.set()
    wait_for(lambda: released)
    assert released == ["result"]  # the late result was handed back, not leaked
    assert all(t.daemon for t in threading.enumerate() if t.name == "kvfs-stuck")
    done = threading.Event()
    job = ex.submit(lambda: 7, on_done=lambda j: done.set())
    assert job is not None and done.wait(DEADLINE) and job.result == 7
    ex.close()


def test_write_through_queue_alone():
    q = WriteThroughQueue()
    rec = BlockRecord("a", 1, 1)
    q.copy(rec, 2)
    q.delete("b", 2)
    q.delete("c", 3)
    assert q.pending() == 3 and q.pending(2) == 2 and q.deleting("b")
    job = q.pop(2)
    assert isinstance(job, CopyJob) and job.rec is rec
    assert q.take_delete(2, "b") is not None and not q.deleting("b")
    q.push_back(DeleteJob("d", 3))
    assert isinstance(q.pop(3), DeleteJob) and q.pending(3) == 1


def test_slot_and_placement_alone(tmp_path):
    clock = Clock()
    slots = [
        TierSlot.build(0, dram(2), eviction="lru", clock=clock),
        TierSlot.build(1, disk(tmp_path / "d"), eviction="lru", clock=clock),
    ]
    catalog = Catalog(2)
    p = Placement(slots, catalog, WriteThroughQueue(), events=EventLog(), clock=clock)
    recs = [BlockRecord(f"b{i}", BLOCK, checksum(blob(i))) for i in range(3)]
    for i, rec in enumerate(recs):
        assert p.drive(p.place(rec, blob(i))) is slots[0]  # a flow: demotions let go of the lock
        with p.locked():
            catalog.add(rec)
    assert recs[0].tiers == slots[1].bit  # demoted when b2 needed the room
    assert catalog.used[0] == 2 * BLOCK and slots[1].reserved == 0 and not slots[1].busy
    for s in slots:
        s.close()


def test_shared_view_alone(tmp_path):
    clock = Clock()
    tier = posix(tmp_path / "shared")
    data = b"x" * 100
    tier.put("ns/a", data, checksum(data))
    view = SharedView([TierSlot.build(0, tier, eviction="lru", clock=clock)], clock=clock, negative_ttl=2.0)
    answer = view.stat("ns/a")
    assert answer.complete and [info.size for _, info in answer.found] == [100]
    assert view.listing("ns") == {"a": False}
    got = []
    done = view.stat_later("ns/b", lambda name, ans: got.append((name, ans.found, ans.complete)))
    assert done is not None and done.wait(DEADLINE)
    assert got == [("ns/b", (), True)]
    view.remember_missing("ns/b")
    assert view.known_missing("ns/b")
    clock.now += 2.1
    assert not view.known_missing("ns/b")
    view.close()
    tier.close()


def _half_open(slot: TierSlot, clock: Clock) -> None:
    slot.failed(TierUnavailable("a hiccup"))
    clock.now += slot.health.retry_after  # half-open: the next thread to ask probes it


def _in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out[0]


def test_a_background_question_that_does_not_start_leaves_the_probe_to_others(tmp_path):
    """A revalidation or listing refresh that starts nothing (too many in flight) must not
    take a half-open tier's probe: its thread never calls the tier, and every other thread
    would skip the tier for another retry_after (a tier that answers again stays unused)."""
    clock = Clock()
    tier = posix(tmp_path / "shared")
    slot = TierSlot.build(0, tier, eviction="lru", clock=clock)
    view = SharedView([slot], clock=clock, listing_ttl=1.0)
    assert view.listing("ns") == {}  # cached, stale later
    view.max_pending = 0  # nothing more starts in the background
    _half_open(slot, clock)
    assert _in_thread(lambda: view.stat_later("ns/a", lambda name, answer: None)) is None
    assert _in_thread(lambda: view.listing("ns")) == {}  # the stale listing; no refresh started
    assert slot.usable(), "a thread that started nothing took the probe"
    view.close()
    tier.close()


def test_a_delete_reaches_a_half_open_shared_tier_in_the_background(tmp_path):
    """The caller of delete does not take the half-open probe for the background delete it
    starts (the limiter's thread, which calls the tier, does), so the delete runs and the
    tier is healthy again without waiting for the write-through task."""
    clock = Clock()
    s = Store([dram(), posix(tmp_path / "shared")], clock=clock, negative_ttl=60.0)  # no revalidation due
    s.put("m/x", blob(1))
    s.run_pending()
    posix_slot = s.slots[1]
    _half_open(posix_slot, clock)
    _in_thread(lambda: s.delete("m/x"))
    deadline = time.monotonic() + DEADLINE
    while posix_slot.busy and time.monotonic() < deadline:  # held until the delete ran
        time.sleep(0.01)
    assert not posix_slot.busy and s.pending == 0, "the background delete never ran"
    assert posix_slot.tier.stat("m/x") is None and posix_slot.health.healthy
    s.close()


def test_leases_alone(tmp_path):
    clock = Clock()
    slots = [TierSlot.build(0, dram(2), eviction="lru", clock=clock)]
    catalog = Catalog(1)
    p = Placement(slots, catalog, WriteThroughQueue(), events=EventLog(), clock=clock)
    leases = Leases(p, clock=lambda: 0.0)
    assert leases.deadline(10) == 10.0 and leases.deadline(10_000) == 600.0
    with pytest.raises(ValueError):
        leases.deadline(0)
    rec = BlockRecord("a", BLOCK, checksum(blob(1)))
    p.drive(p.place(rec, blob(1)))
    with p.locked():
        catalog.add(rec)
    lease = leases.take("a")
    assert lease.tier == "dram" and len(leases) == 1 and leases.release(lease.id) and len(leases) == 0
    slots[0].close()


# -- no tier I/O under the lock --------------------------------------------------------------


@pytest.fixture
def stalling(tmp_path):
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)
    from kvfs.tools.stallfs import StallingMount

    with StallingMount(tmp_path) as m:
        yield m


def test_a_dram_hit_never_waits_behind_a_demotion(stalling):
    """The disk tier stops answering while an eviction demotes to it: the put that evicts
    waits (its demotion is stuck in the kernel), a DRAM hit from another thread does not."""
    s = Store([dram(4), disk(stalling.mountpoint / "disk")], policy=PolicyConfig(eviction="lru"))
    try:
        for i in range(4):
            s.put(f"b{i}", blob(i))
        stalling.stall()
        putter = threading.Thread(target=s.put, args=("b4", blob(4)))
        putter.start()
        deadline = time.monotonic() + DEADLINE
        while not s.slots[1].busy and time.monotonic() < deadline:  # the demotion of b0 is in flight
            time.sleep(0.01)
        assert s.slots[1].busy, "the demotion never started"
        hits: list[bytes] = []
        reader = threading.Thread(target=lambda: hits.extend(s.read(f"b{i}") for i in (1, 2, 3)))
        reader.start()
        reader.join(30)  # the stall lasts until the reader is done: it must not wait for it
        assert not reader.is_alive(), "a DRAM hit waited behind the stalled demotion"
        assert stalling.stalled and putter.is_alive()
        assert hits == [blob(1), blob(2), blob(3)]
        assert s.stat("b0").tiers == ("dram",)  # still served from DRAM while it moves
        assert s.read("b0") == blob(0)
    finally:
        stalling.resume()
        putter.join(30)
        assert not putter.is_alive()
        assert s.stat("b0").tiers == ("disk",) and s.read("b0") == blob(0)
        assert s.stat("b4").tiers == ("dram",)
        s.close()


# -- the flush before unmount --------------------------------------------------------------


def test_flush_never_drops_a_last_copy_and_names_what_it_lost(tmp_path):
    """DRAM holds four blocks, the disk two: the flush writes two down and reports the
    other two by name, instead of evicting the first ones it wrote to fit the rest."""
    s = Store([dram(4), disk(tmp_path / "d", capacity=2 * (BLOCK + 4096))], policy=PolicyConfig(eviction="lru"))
    for i in range(4):
        s.put(f"b{i}", blob(i))
    report = s.flush_report()
    assert report.written == 2 and not report.ok
    lost = dict(report.lost)
    assert len(lost) == 2 and all("disk is full" in why for why in lost.values())
    kept = [n for n in ("b0", "b1", "b2", "b3") if "disk" in s.stat(n).tiers]
    assert len(kept) == 2 and set(kept).isdisjoint(lost)
    assert all(s.read(f"b{i}") == blob(i) for i in range(4))
    s.close()


def test_flush_reports_a_persistent_tier_that_is_down(tmp_path):
    shared = posix(tmp_path / "shared")  # the suite's long timeout: the failure below is made, not waited for
    s = Store([dram(4), shared])
    s.put("a", blob(1))
    s.slots[1].failed(TierUnavailable("nfs stalled"))  # what a timed-out call does
    report = s.flush_report()
    assert report.lost == (("a", "posix is unavailable"),)
    s.close()


class _RefusesCold(LRU):
    """LRU that, as a colder tier, refuses blocks whose names start with ``cold/`` (what
    an admission policy decides from what the tier reads back; here fixed, to test the
    store's side of the decision)."""

    asked: list

    def __init__(self) -> None:
        super().__init__()
        self.asked = []

    def admit(self, key, parent=None, *, hits=0, idle=None):
        self.asked.append((key, parent, hits, idle))
        return not str(key).startswith("cold/")


def test_admission_decides_what_eviction_writes_to_disk(tmp_path):
    """An evicted last copy the disk's policy refuses is dropped, not written; admitted
    ones are demoted. The policy is asked with the record's parent, hits and idle time.
    The flush and an operator's evict never ask: they keep every block."""
    clock = Clock()
    policies: list[_RefusesCold] = []

    def factory(name: str) -> _RefusesCold:
        policies.append(_RefusesCold())
        return policies[-1]

    s = Store([dram(2), disk(tmp_path / "d")], policy=PolicyConfig(eviction="lru"), clock=clock, policy_factory=factory)
    s.put("cold/a", blob(1))
    clock.now += 5
    s.put("warm/b", blob(2), parent="warm/root")
    s.read("warm/b")
    clock.now += 5
    s.put("x/c", blob(3))  # evicts cold/a: refused by the disk, dropped
    assert s.lookup("cold/a") is None
    assert not (tmp_path / "d" / "blocks" / "cold" / "a").exists()
    s.put("x/d", blob(4))  # evicts warm/b: admitted, demoted
    assert s.stat("warm/b").tiers == ("disk",)
    asked = {k: (parent, hits, idle) for k, parent, hits, idle in policies[1].asked}
    assert asked["cold/a"] == (None, 0, 10.0)
    assert asked["warm/b"] == ("warm/root", 1, 5.0)
    assert policies[0].asked == []  # only the colder tier decides

    s.put("cold/e", blob(5))  # DRAM now holds x/d and cold/e
    s.evict("cold/e", "dram")  # the operator's evict keeps the block, admission or not
    assert s.stat("cold/e").tiers == ("disk",)
    s.put("cold/f", blob(6))
    assert s.flush() == 2  # x/d and cold/f: the flush keeps every block too
    assert s.stat("cold/f").tiers == ("dram", "disk")
    assert all(s.read(n) == blob(i) for n, i in [("warm/b", 2), ("x/c", 3), ("x/d", 4), ("cold/e", 5), ("cold/f", 6)])
    s.close()


def test_the_default_policies_get_the_store_clock_and_the_policy_tuning(tmp_path):
    clock = Clock()
    s = Store([dram(2)], policy=PolicyConfig(eviction="session-arc", hint_ttl=7.0), clock=clock)
    policy = s.slots[0].policy
    assert policy._clock is clock and policy._ttl == 7.0
    s.close()


def test_hints_reach_every_tier_policy_and_a_soon_hint_keeps_a_chain(tmp_path):
    """With session-arc, a chain hinted SOON stays in DRAM while newer blocks go; without
    the hint the oldest block would be the victim. Hints reach every tier's policy."""
    clock = Clock()
    s = Store([dram(2), disk(tmp_path / "d")], policy=PolicyConfig(eviction="session-arc"), clock=clock)
    s.put("m/a", blob(1))
    s.put("m/b", blob(2))
    s.hint(["m/a"], Hint.SOON)
    s.put("m/c", blob(3))  # evicts m/b, not the older but hinted m/a
    assert s.stat("m/a").tiers == ("dram",) and s.stat("m/b").tiers == ("disk",)
    seen: list = []
    for slot in s.slots:
        slot.policy.hint = lambda keys, when, seen=seen, tier=slot.name: seen.append((tier, list(keys), when))
    s.hint(["/m/x/", "m/y"], Hint.ENDED)
    assert seen == [("dram", ["m/x", "m/y"], Hint.ENDED), ("disk", ["m/x", "m/y"], Hint.ENDED)]
    with pytest.raises(InvalidName):
        s.hint(["../escape"], Hint.SOON)
    s.close()


# -- leases ------------------------------------------------------------------------------------


def test_a_dram_lease_keeps_its_extent_until_released(tmp_path):
    s = Store([dram(2), disk(tmp_path / "d")], policy=PolicyConfig(eviction="lru"))
    s.put("a", blob(1))
    lease = s.lease("a")
    loc = lease.location
    assert lease.tier == "dram" and loc is not None and loc.length == BLOCK
    s.delete("a")  # removed, and its extent would be reused by the next writes...
    for i in range(4):
        s.put(f"x{i}", blob(10 + i))
    with open(loc.path, "rb") as f:  # ...but a reader of the arena (another process) still sees it
        f.seek(loc.offset)
        assert f.read(loc.length) == blob(1)
    assert s.release(lease) and not s.release(lease)
    s.close()


def test_a_disk_lease_keeps_its_file_from_removal_and_replacement(tmp_path):
    tiers = [dram(1), disk(tmp_path / "d"), posix(tmp_path / "shared")]
    s = Store(tiers, policy=PolicyConfig(eviction="lru", promote=PromoteMode.NEVER))
    s.put("a", blob(1))
    s.put("b", blob(2))  # a goes down to disk
    assert s.stat("a").tiers == ("disk",)
    lease = s.lease("a", ttl=60)
    loc = lease.location
    assert loc is not None and lease.tier == "disk"
    s.put("a", blob(3))  # a new version: lands in DRAM, the leased file stays
    s.put("c", blob(4))  # evicting the new a: its demotion skips the leased file, goes to posix
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        assert f.read(loc.length) == blob(1)
    assert s.stat("a").tiers == ("posix",) and s.read("a") == blob(3)
    s.delete("a")
    assert os.path.exists(loc.path)  # removal waits for the lease
    s.release(lease)
    assert not os.path.exists(loc.path)
    s.close()


def test_leases_expire(tmp_path):
    now = [0.0]
    s = Store([dram(2), disk(tmp_path / "d")], lease_clock=lambda: now[0])
    s.put("a", blob(1))
    s.flush()
    lease = s.lease("a", tier="disk", ttl=5)
    assert s.slots[1].is_busy("a")
    now[0] = 4.0
    assert s.expire_leases() == 0
    now[0] = 5.0
    assert s.expire_leases() == 1 and not s.slots[1].is_busy("a")
    assert not s.release(lease)
    s.close()


# -- rebuild -----------------------------------------------------------------------------------


def test_a_header_naming_dot_dot_is_corrupt_and_never_moved(tmp_path):
    root = tmp_path / "d"
    d = disk(root)
    d.close()
    data = b"evil" * 1000
    for header_name in ("../../x", "/etc/kvfs-x", "a//b"):
        f = root / "blocks" / "ns" / f"f{len(header_name)}"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(encode_header(header_name, len(data), checksum(data)) + data)
    os.symlink("/etc/passwd", root / "blocks" / "ns" / "link")
    s = Store([disk(root)])
    assert len(s) == 0
    assert s.statistics().tiers[0].corrupt == 4 and s.rebuilt_corrupt == 4
    assert not (tmp_path / "x").exists() and not (root / "x").exists() and not Path("/etc/kvfs-x").exists()
    assert os.listdir(root / "blocks" / "ns") == []  # removed from the tier, nothing moved out
    assert Path("/etc/passwd").exists()
    kinds = [e.kind for e in s.events.drain()]
    assert kinds == [EventKind.CORRUPT] * 4
    s.close()


def test_an_interrupted_rename_is_still_completed(tmp_path):
    root = tmp_path / "d"
    disk(root).close()
    data = b"y" * 5000
    (root / "blocks" / "old").write_bytes(encode_header("new/name", len(data), checksum(data)) + data)
    s = Store([disk(root)])
    assert s.read("new/name") == data and not (root / "blocks" / "old").exists()
    s.close()


# -- durability --------------------------------------------------------------------------------


@pytest.mark.parametrize("on", [False, True])
def test_fsync_is_a_per_tier_setting(tmp_path, monkeypatch, on):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    t = disk(tmp_path / "d", fsync=on)
    t.put("ns/a", b"x", checksum(b"x"))
    assert len(synced) == (2 if on else 0)  # the file, then its directory
    t.close()


# -- shared tiers --------------------------------------------------------------------------------


def test_revalidation_runs_in_the_background(tmp_path):
    """With shared_wait = 0 (the daemon's), a due revalidation never makes the caller
    wait: the read is served from DRAM, and the deletion on another node is applied when
    the background answer arrives."""
    clock = Clock()
    a = Store([dram(), posix(tmp_path / "shared")], clock=clock, negative_ttl=2.0)
    b = Store([dram(), posix(tmp_path / "shared")], clock=clock, negative_ttl=2.0)
    a.put("m/x", blob(1))
    a.run_pending()
    assert b.read("m/x") == blob(1)
    a.delete("m/x")
    a.run_pending()
    clock.now += 2.5
    assert b.read("m/x") == blob(1)  # answered from DRAM; the check runs meanwhile
    deadline = time.monotonic() + DEADLINE
    while b.lookup("m/x") is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b.lookup("m/x") is None
    with pytest.raises(BlockNotFound):
        b.read("m/x")
    a.close(), b.close()


def test_a_bad_local_copy_after_restart_falls_to_the_shared_one(tmp_path):
    data = blob(7)
    a = Store([dram(), disk(tmp_path / "d"), posix(tmp_path / "shared")])
    a.put("m/x", data)
    a.run_pending()  # written through to posix
    a.prefetch("m/x", "disk")
    a.close()
    f = tmp_path / "d" / "blocks" / "m" / "x"
    raw = bytearray(f.read_bytes())
    raw[4096 + 10] ^= 0xFF
    f.write_bytes(raw)
    a = Store([dram(), disk(tmp_path / "d"), posix(tmp_path / "shared")])
    assert a.stat("m/x").tiers == ("disk",)  # the shared copy is not known yet at start
    assert a.read("m/x") == data  # the first read: the bad disk copy dropped, posix's read
    assert a.statistics().tiers[1].corrupt == 1
    assert "posix" in a.stat("m/x").tiers
    a.close()


def test_mkdir_under_a_directory_another_node_created(tmp_path):
    a = Store([dram(), posix(tmp_path / "shared")])
    b = Store([dram(), posix(tmp_path / "shared")])
    a.put("ns/ab/blk", b"x")
    a.run_pending()
    b.mkdir("ns/ab/sub")  # ns/ab exists here only through the shared tier
    assert b.listdir("ns/ab") == {"blk": False, "sub": True}
    a.close(), b.close()


def test_a_rename_while_the_write_through_runs_copies_the_block_under_its_new_name(stalling, tmp_path):
    """The engines' publish (write a temporary name, rename it into place) racing the
    write-through: the copy into posix is being written under the temporary name when the
    rename runs. The record must never claim a posix copy that posix does not hold under
    the block's name (another node would never find it there: tests/cluster/test_two_mounts.py
    saw B learn only the s3 copy), and the file left under the old name is nobody's."""
    data = blob(11)
    a = Store([dram(), posix(stalling.mountpoint / "shared", timeout=60.0)])
    b = Store([dram(), posix(stalling.source / "shared")])  # another node, on the same files
    renamer: threading.Thread | None = None
    try:
        a.put("m/ab/.x1.tmp", data)
        stalling.stall()
        copier = threading.Thread(target=a.run_pending)
        copier.start()
        deadline = time.monotonic() + DEADLINE
        while not a.slots[1].busy and time.monotonic() < deadline:  # the copy into posix is in flight
            time.sleep(0.01)
        assert a.slots[1].busy == {"m/ab/.x1.tmp": 1}, "the write-through never started"
        renamer = threading.Thread(target=a.rename, args=("m/ab/.x1.tmp", "m/ab/x1"))
        renamer.start()
        renamer.join(30)  # a DRAM block's rename needs no posix I/O: the stall does not hold it
        assert not renamer.is_alive(), "the rename waited for the stalled write-through"
        stalling.resume()
        copier.join(30)
        assert not copier.is_alive()
        a.run_pending()  # whatever the copy left queued (the old name's delete)
        assert a.read("m/ab/x1") == data
        tier = a.slots[1].tier
        if "posix" in a.stat("m/ab/x1").tiers:
            assert tier.stat("m/ab/x1") is not None, "the record claims a posix copy that is not there"
        assert tier.stat("m/ab/.x1.tmp") is None, "the copy written under the old name was left behind"
        assert a.stat("m/ab/x1").tiers == ("dram", "posix")  # written through under the new name
        assert b.read("m/ab/x1") == data and b.stat("m/ab/x1").tiers == ("dram", "posix")
        assert b.lookup("m/ab/.x1.tmp") is None
    finally:
        stalling.resume()
        a.close(), b.close()


class _GatedReads:
    """Holds reads of block files by the threads that :meth:`enter` until :meth:`open`:
    a thread caught inside its tier call with the store's lock let go."""

    def __init__(self, monkeypatch, directory) -> None:
        self._real = directory.read
        self._threads: set[int] = set()
        self.inside, self._go = threading.Event(), threading.Event()
        monkeypatch.setattr(directory, "read", self._read)

    def enter(self) -> None:
        self._threads.add(threading.get_ident())

    def open(self) -> None:
        self._go.set()

    def _read(self, name: str):
        if threading.get_ident() in self._threads:
            self.inside.set()
            self._go.wait(10)
        return self._real(name)

    def rename_while_held(self, s: Store, fn, old: str, new: str) -> None:
        """Run *fn* in a thread whose reads are held; rename *old* to *new* while it is
        inside one, then let it go on and wait for it."""

        def held() -> None:
            self.enter()
            fn()

        t = threading.Thread(target=held)
        t.start()
        assert self.inside.wait(10)
        s.rename(old, new)
        self.open()
        t.join(30)
        assert not t.is_alive()


def test_a_read_racing_a_rename_never_loses_the_copy(tmp_path, monkeypatch):
    """A read of a disk copy runs with the lock let go; a rename of the block may run
    meanwhile (the engines' publish renames a name just written). The read then finds no
    file under the old name, or a header already naming the new one: neither says anything
    about the copy, which must stay the block's (it was its only one here)."""
    s = Store([dram(), disk(tmp_path / "d")])
    s.put("m/.x.tmp", blob(3))
    s.evict("m/.x.tmp", "dram")
    assert s.stat("m/.x.tmp").tiers == ("disk",)
    gate = _GatedReads(monkeypatch, s.slots[1].tier.dir)
    got: list[object] = []

    def read() -> None:
        try:
            got.append(s.read("m/.x.tmp"))
        except BlockNotFound as exc:  # renamed away while it was read: a miss is right too
            got.append(exc)

    gate.rename_while_held(s, read, "m/.x.tmp", "m/x")
    assert got and (got[0] == blob(3) or isinstance(got[0], BlockNotFound))
    assert s.stat("m/x").tiers == ("disk",), "the read dropped the copy it raced"
    assert s.read("m/x") == blob(3)
    assert s.statistics().tiers[1].corrupt == 0
    s.close()


def test_a_write_through_reading_a_block_being_renamed_copies_it_under_the_new_name(tmp_path, monkeypatch):
    """The write-through reads the block's hottest copy (here on disk, DRAM evicted it)
    with the lock let go; renamed meanwhile, the copy is queued again under the new name
    instead of being skipped (the shared tier would never get the block)."""
    s = Store([dram(), disk(tmp_path / "d"), posix(tmp_path / "shared")])
    s.put("m/.x.tmp", blob(4))
    s.evict("m/.x.tmp", "dram")
    assert s.stat("m/.x.tmp").tiers == ("disk",) and s.pending == 1
    gate = _GatedReads(monkeypatch, s.slots[1].tier.dir)
    gate.rename_while_held(s, s.run_pending, "m/.x.tmp", "m/x")
    s.run_pending()
    assert s.stat("m/x").tiers == ("disk", "posix")
    assert s.slots[2].tier.stat("m/x") is not None and s.slots[2].tier.stat("m/.x.tmp") is None
    s.close()


def test_a_rename_waits_for_a_busy_copy_instead_of_failing(tmp_path, monkeypatch):
    """A rename whose disk copy is busy (being copied to another tier) waits for it, then
    renames: a program's os.replace must not fail with EIO because a demotion was in
    flight (kvfs bench soak met it, issue 20)."""
    import kvfs.renames

    s = Store([dram(), disk(tmp_path / "d")])
    s.put("r/.x.tmp", blob(4))
    s.evict("r/.x.tmp", "dram")
    slot = s.slots[1]
    with s.placement.locked():
        slot.hold("r/.x.tmp")  # as a copy to another tier holds it
    real_sleep = time.sleep
    waited = []

    def release_then_sleep(seconds: float) -> None:  # the move ends while the rename waits
        if not waited:
            with s.placement.locked():
                s.placement.release_hold(slot, "r/.x.tmp")
        waited.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(kvfs.renames.time, "sleep", release_then_sleep)
    s.rename("r/.x.tmp", "r/x")
    assert waited and s.read("r/x") == blob(4) and not s.exists("r/.x.tmp")
