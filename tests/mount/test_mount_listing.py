"""Listings on a real mount, on both transports (docs/SEMANTICS.md line 22): a directory
read in several READDIRPLUS replies lists each name exactly once with the attributes a
``stat`` of it gives, also while entries are created and removed meanwhile (issue 25:
the kernel transport packs these replies itself, ``mount/kernel/encode.py``, and the
store answers a listing's entries in batches, ``Store.probe_many``)."""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path

import pytest

from support.configs import dram_over_disk
from support.metrics import scrape
from support.mounts import TRANSPORTS
from support.s3server import free_port

pytestmark = [pytest.mark.fuse, TRANSPORTS]

CONFIG = dram_over_disk("64MiB", "256MiB", "{data}/disk") + "\n[mount]\nmetrics_port = {port}\n"

# Long names make every entry ~400 bytes: this many fill more than one reply of the
# kernel's largest (1 MiB) READDIRPLUS buffer.
N = 3000
LONG = "n" * 230


def _mount(kvfs_mount, tmp_path: Path) -> tuple[Path, int]:
    port = free_port()
    data = tmp_path / "data"
    return kvfs_mount(CONFIG.format(data=data, port=port), data=data), port


def _readdirs(port: int) -> float:
    return scrape(port).get(("kvfs_fuse_operations_total", (("op", "readdir"),)), 0.0)


def _name(i: int) -> str:
    return f"{i:05d}-{LONG}"


def _fill(d: Path, n: int) -> dict[str, int]:
    """*n* blocks of 0-6 bytes and three directories in *d*: ``{name: size}`` (-1: a directory)."""
    d.mkdir()
    made = {}
    for i in range(n):
        (d / _name(i)).write_bytes(b"x" * (i % 7))
        made[_name(i)] = i % 7
    for k in range(3):
        (d / f"sub{k}").mkdir()
        (d / f"sub{k}" / "inner").write_bytes(b"i")
        made[f"sub{k}"] = -1
    return made


def test_a_listing_over_several_replies_has_each_name_once_with_its_attributes(kvfs_mount, tmp_path):
    mp, port = _mount(kvfs_mount, tmp_path)
    made = _fill(mp / "big", N)
    before = _readdirs(port)
    with os.scandir(mp / "big") as it:
        entries = list(it)
    assert _readdirs(port) - before >= 2  # read in several replies
    counts = Counter(e.name for e in entries)
    assert set(counts) == set(made) and set(counts.values()) == {1}
    for e in entries:
        st = e.stat(follow_symlinks=False)  # from the reply's attributes, as the kernel keeps them
        fresh = os.lstat(e.path)
        assert st.st_ino == fresh.st_ino == e.inode()
        if made[e.name] < 0:
            assert e.is_dir() and stat.S_ISDIR(st.st_mode)
        else:
            assert e.is_file() and stat.S_ISREG(st.st_mode)
            assert st.st_size == fresh.st_size == made[e.name]
            assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_nlink == 1
            assert (st.st_uid, st.st_gid, st.st_mtime_ns) == (fresh.st_uid, fresh.st_gid, fresh.st_mtime_ns)
    # a second listing (every inode known now) says the same
    assert sorted(os.listdir(mp / "big")) == sorted(made)


def test_entries_created_and_removed_during_a_listing(kvfs_mount, tmp_path):
    """A listing reads the names its opendir saw (a snapshot): names created since are not
    in it, names removed since are listed at most once (once when read before they went),
    every other name exactly once; and a file being written is listed with its size."""
    mp, _ = _mount(kvfs_mount, tmp_path)
    d = mp / "busy"
    made = _fill(d, N)
    order = sorted(made)
    gone = set(order[:20] + order[N // 2 : N // 2 + 20] + order[-40:-3])  # blocks (sub0-2 sort last)
    assert all(made[n] >= 0 for n in gone)
    writing = open(d / "w-being-written", "wb")  # closed below
    try:
        writing.write(b"w" * 11)
        writing.flush()
        seen = Counter()
        added = []
        with os.scandir(d) as it:
            first = next(it)
            seen[first.name] += 1
            for i, name in enumerate(sorted(gone)):
                os.unlink(d / name)
                added.append(f"new-{i:03d}")
                (d / added[-1]).write_bytes(b"n")
            for e in it:
                seen[e.name] += 1
                if e.name == "w-being-written":
                    assert e.stat(follow_symlinks=False).st_size == 11
    finally:
        writing.close()
    assert not set(added) & set(seen)
    assert all(seen[n] <= 1 for n in gone)
    kept = (set(made) - gone) | {"w-being-written"}
    assert {n: c for n, c in seen.items() if n not in gone} == dict.fromkeys(kept, 1)
    # and afterwards: the new names, not the removed ones
    assert set(os.listdir(d)) == kept | set(added)
