"""Tier moves as explicit two-phase steps (kvfs/moves.py): prepare under the lock, the I/O
with no lock held, complete (the one re-check) under it again.

- nothing in the code lets go of a lock held further up (``RLock._release_save``): the I/O
  phase runs where the ``with`` scope of the lock has ended (``Placement.drive``);
- a copy written to a persistent tier while its block is renamed, deleted or replaced leaves
  no file under a name nobody claims and no stale copy in any record; the block's bytes
  end in the right place;
- a read of a disk copy while the block is renamed returns the block's bytes or a clean
  miss, and never drops the renamed copy;
- the I/O phase runs with the lock free: the other thread's rename or delete finishes
  while the tier is held open, and a step refuses to run with the lock held.

Each race is held open deterministically by a tier subclass that waits on a
``threading.Event`` inside its I/O; no sleeps.
"""

from __future__ import annotations

import ast
import random
import threading
from pathlib import Path
from typing import Any

import pytest

import kvfs
from kvfs.blockfile import checksum
from kvfs.catalog import BlockRecord
from kvfs.config import DiskConfig, DramConfig, WriteMode
from kvfs.errors import BlockNotFound, StoreBusy
from kvfs.moves import CopyWrite, Phase
from kvfs.names import TierName
from kvfs.store import Store
from kvfs.tier import BlockRef
from kvfs.tiers.disk import DiskTier
from kvfs.tiers.dram import DramTier

from support.deadlines import DEADLINE

BLOCK = 64 << 10
ROOT = Path(kvfs.__file__).resolve().parent


def blob(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


def dram(blocks: int = 4) -> DramTier:
    return DramTier(DramConfig(name=TierName("dram"), capacity=blocks * BLOCK, mlock=False, prefault=False))


class GatedDisk(DiskTier):
    """A disk tier whose next put or open, once armed, waits inside the I/O until released."""

    def __init__(self, config: DiskConfig) -> None:
        super().__init__(config)
        self.armed: str | None = None  # "put" or "open"
        self.inside = threading.Event()
        self.release = threading.Event()

    def arm(self, what: str) -> None:
        self.armed = what
        self.inside.clear()
        self.release.clear()

    def _gate(self, what: str) -> None:
        if self.armed == what:
            self.armed = None
            self.inside.set()
            assert self.release.wait(DEADLINE), "the test never released the tier"

    def put(self, name: str, data: Any, checksum: int) -> None:
        self._gate("put")
        super().put(name, data, checksum)

    def open(self, name: str) -> BlockRef:
        self._gate("open")
        return super().open(name)


def gated_disk(path: Path, **kw: Any) -> GatedDisk:
    return GatedDisk(DiskConfig(name=TierName("disk"), capacity=64 << 20, path=path, **kw))


def files_in(tier_dir: Path) -> set[str]:
    """The block files (and any temporary file) a disk tier holds; not its lock file."""
    return {p.relative_to(tier_dir).as_posix() for p in tier_dir.rglob("*") if p.is_file()} - {"lock"}


def in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn(*args))
        except BaseException as exc:  # handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def finished(t: threading.Thread) -> bool:
    t.join(DEADLINE)
    return not t.is_alive()


# -- the lock is never let go under a caller ------------------------------------------------


def test_no_lock_is_let_go_under_a_caller():
    """No module of kvfs releases the store's RLock however deeply it is held: the I/O of a
    move runs where the ``with`` scope of the lock has ended (fails on the code before the
    two-phase steps, where ``Placement.unlocked`` called ``_release_save``)."""
    found = []
    sources = [p for top in ("kvfs", "tiers", "mount", "gpu", "tools") for p in (ROOT.parent / top).rglob("*.py")]
    assert len(sources) > 100
    for path in sorted(sources):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("_release_save", "_acquire_restore", "unlocked"):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {node.attr}")
            if isinstance(node, ast.FunctionDef) and node.name == "unlocked":
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: def unlocked")
    assert not found, "\n".join(found)


def test_a_step_refuses_to_run_with_the_lock_held(tmp_path):
    s = Store([gated_disk(tmp_path / "d")])
    p, slot = s.placement, s.slots[0]
    rec = BlockRecord("a", BLOCK, 0)
    with p.locked():
        step = CopyWrite(p, slot, rec, blob(1), BLOCK, None, new=True)
        with pytest.raises(RuntimeError, match="lock held"):
            step.run()
        step.abort()
        assert step.phase is Phase.ENDED and slot.reserved == 0 and not slot.is_busy("a")
    assert not files_in(tmp_path / "d")
    s.close()


def test_a_flow_needing_io_under_a_held_lock_is_refused_and_undone(tmp_path):
    """A caller holding the lock cannot have it let go under it: a flow that reaches a step
    there (a put into full DRAM demotes its victim to disk) is refused with RuntimeError,
    the step aborted (no room or hold left), the victim untouched."""
    s = Store([dram(blocks=1), gated_disk(tmp_path / "d")])
    s.put("m/a", blob(1))
    p = s.placement
    rec = BlockRecord("m/b", BLOCK, checksum(blob(2)))
    with p.locked():
        with pytest.raises(RuntimeError, match="holds the store's lock"):
            p.drive(p.place(rec, blob(2)))
        assert s.slots[1].reserved == 0 and not s.slots[1].busy
    assert s.lookup("m/a").tiers == ("dram",) and s.read("m/a") == blob(1)
    assert not files_in(tmp_path / "d")
    s.close()


def test_a_flow_needing_io_under_nowait_is_store_busy_and_undone(tmp_path):
    """Inside ``Store.nowait`` (the mount's calls on its event loop) a flow that needs tier
    I/O is refused with StoreBusy, which sends the call to a worker thread, never with an
    error the caller cannot recover from; nothing is left reserved or held."""
    s = Store([dram(blocks=1), gated_disk(tmp_path / "d")])
    s.put("m/a", blob(1))
    p = s.placement
    rec = BlockRecord("m/b", BLOCK, checksum(blob(2)))
    with pytest.raises(StoreBusy):
        p.nowait(p.drive, p.place(rec, blob(2)))
    assert s.slots[1].reserved == 0 and not s.slots[1].busy
    assert s.lookup("m/a").tiers == ("dram",) and s.read("m/a") == blob(1)
    assert not files_in(tmp_path / "d")
    s.close()


# -- a write to a persistent tier while the block changes -------------------------------------


@pytest.mark.parametrize("change", ["rename", "delete", "replace"])
def test_a_write_through_racing_a_change_leaves_no_orphan_and_no_stale_copy(tmp_path, change):
    """A write-through copy is held open inside the disk tier's put; meanwhile another
    thread renames, deletes or replaces the block (memory only: no tier I/O, so it must
    finish while the put is held, which it can only if the put holds no lock). Released,
    the write's complete finds the record changed: the file it wrote is deleted, the
    record gains no copy; a renamed block's copy is made again under its new name."""
    disk_dir = tmp_path / "d"
    disk = gated_disk(disk_dir, write=WriteMode.THROUGH)
    s = Store([dram(), disk])
    s.put("m/a", blob(1))
    disk.arm("put")
    writer, wrote = in_thread(s.run_pending)
    assert disk.inside.wait(DEADLINE)
    ops = {
        "rename": lambda: s.rename("m/a", "m/b"),
        "delete": lambda: s.delete("m/a"),
        "replace": lambda: s.put("m/a", blob(2)),
    }
    other, _ = in_thread(ops[change])
    assert finished(other), f"the {change} waited for a put in flight: the put held the lock"
    disk.release.set()
    assert finished(writer) and not isinstance(wrote[0], BaseException)
    with s.placement.locked():
        assert s.slots[1].reserved == 0 and not s.slots[1].busy
    if change == "rename":
        assert s.lookup("m/b").tiers == ("dram",)  # no stale disk copy under the old name
        assert not files_in(disk_dir)  # the file written under m/a is nobody's: deleted
        s.run_pending()  # queued again under the new name
        assert s.lookup("m/b").tiers == ("dram", "disk")
        s.evict("m/b", "dram")
        assert s.read("m/b") == blob(1)
    elif change == "delete":
        assert not s.exists("m/a") and not files_in(disk_dir)
    else:
        assert s.lookup("m/a").tiers == ("dram",)  # the new version: no copy of the old one
        s.run_pending()
        s.evict("m/a", "dram")
        assert s.read("m/a") == blob(2)  # the new version's bytes, never the old
    s.close()


def test_a_demotion_racing_a_delete_leaves_no_orphan(tmp_path):
    """A DRAM put that must evict demotes its victim into the disk tier; while that write
    is held open the victim is deleted by another thread. No file is left for it and the
    put that made the room completes."""
    disk_dir = tmp_path / "d"
    disk = gated_disk(disk_dir)
    s = Store([dram(blocks=1), disk])
    s.put("m/a", blob(1))
    disk.arm("put")
    putter, put = in_thread(s.put, "m/b", blob(2))
    assert disk.inside.wait(DEADLINE)
    deleter, _ = in_thread(s.delete, "m/a")
    assert finished(deleter), "the delete waited for a demotion in flight: the demotion held the lock"
    disk.release.set()
    assert finished(putter) and not isinstance(put[0], BaseException)
    assert not s.exists("m/a") and s.read("m/b") == blob(2)
    assert not files_in(disk_dir)
    with s.placement.locked():
        assert s.slots[1].reserved == 0 and not s.slots[1].busy
    s.close()


# -- a read of a persistent copy while the block is renamed --------------------------------


def test_a_read_racing_a_rename_returns_the_bytes_or_a_clean_miss(tmp_path):
    """A read of the block's disk copy is held open before the file is opened; meanwhile
    the block (and its file) is renamed by another thread, which must finish while the read
    is held. The read ends in a clean miss for the old name (never other bytes), and the
    renamed copy is kept: neither forgotten nor counted corrupt."""
    disk = gated_disk(tmp_path / "d")
    s = Store([dram(), disk])
    s.put("m/a", blob(3))
    s.evict("m/a", "dram")
    disk.arm("open")
    reader, got = in_thread(s.read, "m/a")
    assert disk.inside.wait(DEADLINE)
    renamer, renamed = in_thread(s.rename, "m/a", "m/b")
    assert finished(renamer) and renamed == [None], "the rename waited for a read in flight"
    disk.release.set()
    assert finished(reader)
    assert got[0] == blob(3) or isinstance(got[0], BlockNotFound)
    assert s.lookup("m/b").tiers[-1] == "disk" and s.slots[1].counters.corrupt == 0
    assert s.read("m/b") == blob(3)
    s.close()


def test_a_read_whose_file_is_open_survives_a_rename(tmp_path):
    """The same race with the file already open when the rename runs: the read returns
    the block's bytes."""

    class LateGate(GatedDisk):
        def open(self, name: str) -> BlockRef:
            ref = DiskTier.open(self, name)
            self._gate("open")
            return ref

    disk = LateGate(DiskConfig(name=TierName("disk"), capacity=64 << 20, path=tmp_path / "d"))
    s = Store([dram(), disk])
    s.put("m/a", blob(4))
    s.evict("m/a", "dram")
    disk.arm("open")
    reader, got = in_thread(s.read, "m/a")
    assert disk.inside.wait(DEADLINE)
    renamer, _ = in_thread(s.rename, "m/a", "m/b")
    assert finished(renamer)
    disk.release.set()
    assert finished(reader) and got[0] == blob(4)
    assert s.slots[1].counters.corrupt == 0 and s.read("m/b") == blob(4)
    s.close()
