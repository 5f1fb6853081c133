"""The DRAM arena holds only what it has used: its memory is reserved (and locked, where
mlock is on) in steps as extents are first handed out, ahead only by the window its
owner's background pass asks for (``reserve_ahead``), and never an extent that is not
reserved, so a full /dev/shm after mount makes the tier act smaller and never
SIGBUSes a writer (tiers/dram.py, "Reservation"; docs/store.md, "Ownership")."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from kvfs.config import DramConfig
from kvfs.errors import TierFull
from kvfs.names import TierName
from kvfs.tiers.dram import HEADER, STEP, DramTier

MiB = 1 << 20


def allocated(path: Path) -> int:
    """Bytes the filesystem has allocated to *path* (what the arena holds of it)."""
    return os.stat(path).st_blocks * 512


def locked_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmLck:"))


@pytest.fixture
def arena_path():
    p = Path(f"/dev/shm/kvfs-test-{uuid.uuid4().hex[:8]}")
    yield p
    if p.exists():
        p.unlink()


def test_a_new_arena_holds_one_step_and_grows_with_the_blocks_put(arena_path):
    t = DramTier(DramConfig(name=TierName("dram"), capacity=256 * MiB, path=arena_path, mlock=False, prefault=True))
    try:
        assert t.arena_size == HEADER + 256 * MiB  # the whole size, as clients map it
        assert allocated(arena_path) == t.reserved_bytes == STEP  # but only the first step is memory
        for i in range(5):
            t.put(f"b{i}", bytes([i]) * MiB, i)
        assert t.reserved_bytes == HEADER + 5 * MiB + (STEP - (HEADER + 5 * MiB) % STEP)  # rounded up to a step
        assert allocated(arena_path) == t.reserved_bytes
        for i in range(5):  # replacing, deleting and putting again reuse what is reserved
            t.delete(f"b{i}")
            t.put(f"c{i}", bytes([i]) * MiB, i)
        assert t.reserved_bytes == 6 * MiB
        with t.open("c3") as ref:
            assert bytes(ref.data) == bytes([3]) * MiB
    finally:
        t.close()


def test_a_client_reservation_is_reserved_before_it_is_handed_out(arena_path):
    t = DramTier(DramConfig(name=TierName("dram"), capacity=64 * MiB, path=arena_path, mlock=False, prefault=False))
    try:
        off = t.reserve(3 * MiB)
        loc = t.reserved_location(off, 3 * MiB)
        assert allocated(arena_path) >= loc.offset + loc.length  # a client writing it cannot SIGBUS
        t.abort(off, 3 * MiB)
    finally:
        t.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="locks more than the default memlock limit: needs CAP_IPC_LOCK")
def test_mlock_locks_what_is_reserved_not_the_whole_arena(arena_path):
    before = locked_kib()
    t = DramTier(DramConfig(name=TierName("dram"), capacity=512 * MiB, path=arena_path, mlock=True))
    try:
        assert t.locked
        assert (locked_kib() - before) * 1024 == STEP
        t.put("a", b"a" * (3 * MiB), 1)
        assert (locked_kib() - before) * 1024 == t.reserved_bytes == 2 * STEP
    finally:
        t.close()


def test_a_filesystem_full_after_start_makes_the_tier_act_smaller_never_sigbus(small_tmpfs):
    path = small_tmpfs / "arena"
    t = DramTier(DramConfig(name=TierName("dram"), capacity=3 * MiB, path=path, mlock=False, prefault=False))
    try:
        assert t.reserved_bytes == STEP
        filler = small_tmpfs / "filler"  # another program takes the rest of the filesystem
        with open(filler, "wb") as f, pytest.raises(OSError):
            while True:  # grows the file (and takes the memory) until the filesystem is full
                os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size + 256 * 1024)
        t.put("a", b"a" * (STEP - HEADER), 1)  # fits in what is reserved
        assert t.unreserved_ahead(MiB) > 0 and t.reserve_ahead(MiB) == 0  # the window finds no room
        assert t.unreserved_ahead(MiB) == 0  # and is not asked for again (no thread every 50 ms)
        with pytest.raises(TierFull, match=rf"DRAM arena cannot grow past 2 MiB: {small_tmpfs} is full"):
            t.put("b", b"b" * MiB, 2)
        assert t.stat("b") is None
        with pytest.raises(TierFull):
            t.reserve(MiB)
        with t.open("a") as ref:  # what it holds still reads
            assert bytes(ref.data) == b"a" * (STEP - HEADER)
        filler.unlink()  # room again: the arena grows
        t.put("b", b"b" * MiB, 2)
        assert t.unreserved_ahead(MiB) == t.reserve_ahead(MiB)  # a window again (to the arena's end)
        with t.open("b") as ref:
            assert bytes(ref.data) == b"b" * MiB
    finally:
        t.close()


def test_reserve_ahead_reserves_a_window_past_the_highest_extent_off_the_puts_path(arena_path):
    """The mount's background pass reserves the arena ahead of its highest extent, so the
    seals that follow put into memory that is there already and grow nothing themselves."""
    t = DramTier(DramConfig(name=TierName("dram"), capacity=64 * MiB, path=arena_path, mlock=False, prefault=True))
    try:
        assert t.unreserved_ahead(8 * MiB) == t.reserve_ahead(8 * MiB) == 0  # nothing written: no window
        assert t.reserved_bytes == STEP
        t.put("a", b"x" * (3 * MiB), 1)
        assert t.reserved_bytes == 4 * MiB  # the put's own steps: header + 3 MiB, rounded up
        assert t.unreserved_ahead(8 * MiB) == 8 * MiB  # header + 3 MiB + 8 MiB, rounded up to 12 MiB
        assert t.reserved_bytes == 4 * MiB  # asking reserves nothing
        assert t.reserve_ahead(8 * MiB) == 8 * MiB
        assert t.reserved_bytes == allocated(arena_path) == 12 * MiB
        assert t.unreserved_ahead(8 * MiB) == t.reserve_ahead(8 * MiB) == 0  # nothing more until more is used
        for i in range(4):  # these fit below what was reserved ahead: no growth on their path
            t.put(f"b{i}", bytes([i]) * (2 * MiB), i)
        assert t.reserved_bytes == 12 * MiB
        assert t.reserve_ahead(100 * MiB) == t.arena_size - 12 * MiB  # never past the arena
        with t.open("b2") as ref:
            assert bytes(ref.data) == bytes([2]) * (2 * MiB)
    finally:
        t.close()
    assert t.reserve_ahead(8 * MiB) == t.unreserved_ahead(8 * MiB) == 0  # closed: nothing touched


def test_reserve_ahead_beside_puts_never_hands_out_memory_that_is_not_reserved(arena_path):
    """A put that needs the range a background reserve_ahead is working on reserves it
    itself; the arena never gets an extent past what is reserved, and every block reads back."""
    t = DramTier(DramConfig(name=TierName("dram"), capacity=96 * MiB, path=arena_path, mlock=False, prefault=True))
    stop = threading.Event()

    def grow() -> None:
        while not stop.is_set():
            t.reserve_ahead(4 * MiB)

    grower = threading.Thread(target=grow)
    grower.start()
    try:
        for i in range(40):
            t.put(f"b{i}", bytes([i]) * (2 * MiB + 4096 * (i % 3)), i)
            assert t.reserved_bytes >= HEADER + t._alloc.high_water()
    finally:
        stop.set()
        grower.join()
    try:
        assert allocated(arena_path) >= t.reserved_bytes
        for i in range(40):
            with t.open(f"b{i}") as ref:
                assert bytes(ref.data) == bytes([i]) * (2 * MiB + 4096 * (i % 3))
    finally:
        t.close()
