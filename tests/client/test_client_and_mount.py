"""One namespace through two paths: a program on the FUSE mount and an engine on the batch
client of the same daemon see each other's blocks at once (docs/client.md, "The mount and
the client").

- a name the kernel cached as missing (the block, or a directory on its way) is found
  through the mount as soon as the client's put returned;
- a block the client replaces shows its new size through the mount at once, while a
  reader that had the old version open keeps its bytes;
- a block written through the mount is what the client reads right after ``close``
  returned, although the kernel releases the file (and kvfs seals it) only after that.
"""

from __future__ import annotations

import os
import random

import pytest

from kvfs.client import Client

from support.mounts import fuse_missing

pytestmark = pytest.mark.skipif(fuse_missing() is not None, reason=fuse_missing() or "")


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture
def mp(kvfs_mount):
    return kvfs_mount(dram="32MiB", disk="64MiB")


def test_a_miss_the_kernel_cached_is_found_right_after_a_client_put(mp):
    os.makedirs(mp / "kv")
    with Client(mp, write=True) as c:
        for i in range(50):
            name = f"kv/d{i}/b{i}"  # the directory is new too
            assert not os.path.exists(mp / name)
            assert not os.path.exists(mp / f"kv/d{i}")  # both misses are now in the kernel's cache
            c.put([name], [blob(4096 + i, i)])
            assert (mp / name).read_bytes() == blob(4096 + i, i)


def test_a_block_the_client_replaces_shows_its_new_size_through_the_mount(mp):
    (mp / "r").write_bytes(blob(10_000, 1))
    with open(mp / "r", "rb") as old:
        assert os.stat(mp / "r").st_size == 10_000  # the kernel caches these attributes
        with Client(mp, write=True) as c:
            c.put(["r"], [blob(3_000, 2)])
        assert os.stat(mp / "r").st_size == 3_000
        assert (mp / "r").read_bytes() == blob(3_000, 2)
        assert old.read() == blob(10_000, 1)  # the reader of the old version keeps it, whole


def test_the_client_reads_what_the_mount_wrote_right_after_close(mp):
    with Client(mp) as c:
        for i in range(100):
            data = blob(8192, i)
            with open(mp / "w", "wb") as f:  # a new version each time
                f.write(data)
            out = bytearray(len(data))
            assert c.read_into(["w"], [out]) is not None
            assert bytes(out) == data, f"round {i}: the client read an older version"
