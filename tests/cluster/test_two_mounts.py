"""Two kvfs mounts on this machine sharing a posix directory and an S3 bucket (issue 4).

Each mount has its own DRAM arena and disk directory; they share one directory (standing
in for Lustre/NFS) and one bucket on moto's S3 server on 127.0.0.1. Everything goes
through real FUSE mounts with plain file I/O, the way engines use kvfs; the store-level
scenarios with a fake clock are in test_two_nodes.py.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

from support.deadlines import HANG
from support.s3server import FAKE_ENV, moto  # noqa: F401 - moto is a fixture
from support.two_mounts import (
    check,
    content,
    publish,
    two_mounts,  # noqa: F401  (a fixture)
    wait_for,
)


def test_written_on_a_read_on_b_promoted_then_removed(two_mounts):
    a, b = two_mounts
    data = content("m/ab/x1")
    publish(a / "m" / "ab" / "x1", data)
    # A copies it down to posix and s3 in the background (write-through, the default)
    wait_for(lambda: check(os.getxattr(a / "m/ab/x1", "user.kvfs.tiers") == b"dram,posix,s3"))
    assert wait_for(lambda: (b / "m/ab/x1").read_bytes()) == data
    tiers = os.getxattr(b / "m/ab/x1", "user.kvfs.tiers").decode().split(",")
    assert tiers[0] == "dram"  # B's read promoted it into B's DRAM
    # and B knows every shared copy: at once, or after a revalidation when a shared tier
    # was slow to answer the first time (a loaded machine can push posix past its deadline)
    wait_for(lambda: check("posix" in os.getxattr(b / "m/ab/x1", "user.kvfs.tiers").decode().split(",")))
    assert "x1" in os.listdir(b / "m" / "ab")
    os.unlink(a / "m/ab/x1")

    def gone_on_b():
        try:
            open(b / "m/ab/x1", "rb").close()
        except FileNotFoundError:
            return
        raise AssertionError("still readable on B")

    # B revalidates within its listing TTL (5 s): 60 s leaves a loaded machine room; what
    # this catches is B never noticing
    wait_for(gone_on_b, timeout=60)


def test_eight_threads_per_node_lose_nothing(two_mounts):
    a, b = two_mounts
    names = [f"w/{i % 8:02x}/blk{i}" for i in range(48)]
    errors: list[str] = []
    written: set[str] = set()
    lock = threading.Lock()

    def worker(mp: Path, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            name = rng.choice(names)
            if rng.random() < 0.5:
                publish(mp / name, content(name, 100_000))
                with lock:
                    written.add(name)
            else:
                try:
                    got = (mp / name).read_bytes()
                except FileNotFoundError:
                    continue
                if got != content(name, 100_000):
                    errors.append(f"{mp.name}:{name}: {len(got)} bytes, wrong or partial")

    threads = [threading.Thread(target=worker, args=(mp, 10 * k + n)) for n, mp in enumerate((a, b)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert written
    for name in sorted(written):  # every block published on either node reads on both
        for mp in (a, b):
            assert wait_for(lambda mp=mp, name=name: (mp / name).read_bytes()) == content(name, 100_000), (mp, name)


@pytest.mark.parametrize("two_mounts", [False], indirect=True)
def test_s32_s3_down_local_blocks_serve_s3_only_blocks_fail_fast_then_recover(two_mounts, moto):
    a, b = two_mounts
    publish(a / "s" / "only-in-s3", content("s/only-in-s3"))
    publish(b / "s" / "local-on-b", content("s/local-on-b"))
    wait_for(lambda: check(os.getxattr(a / "s/only-in-s3", "user.kvfs.tiers").endswith(b"s3")))
    wait_for(lambda: os.stat(b / "s/only-in-s3"))  # B knows of it, holds no copy yet
    assert os.getxattr(b / "s/only-in-s3", "user.kvfs.tiers") == b"s3"
    moto.stop()
    try:
        assert (b / "s/local-on-b").read_bytes() == content("s/local-on-b")
        t0 = time.monotonic()
        with pytest.raises(OSError) as info:
            (b / "s/only-in-s3").read_bytes()
        took = time.monotonic() - t0
        assert info.value.errno == errno.EHOSTDOWN, info.value
        assert took < HANG, took  # bounded: the tier's deadline and 2 attempts, no hang
        df = subprocess_json("df", str(b))
        assert {t["name"]: t["healthy"] for t in df["tiers"]}["s3"] is False
    finally:
        moto.start()
    assert wait_for(lambda: (b / "s/only-in-s3").read_bytes()) == content("s/only-in-s3")


def test_s25_a_block_replaced_on_another_node_while_readers_read(two_mounts):
    """Every version has its own inode here too: B's readers get v1 or v2, whole and with
    its own size, never v1's size with v2's bytes or a mix; old readers keep v1."""
    a, b = two_mounts
    name = "r/ab/blk"
    v1, v2 = content(name, 1 << 20), content(name + "v2", 3 << 20)
    versions = {v1: "v1", v2: "v2"}
    publish(a / name, v1)
    assert wait_for(lambda: (b / name).read_bytes()) == v1
    old = open(b / name, "rb")
    head = old.read(4096)
    stop = threading.Event()
    bad: list[str] = []
    seen: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                with open(b / name, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    data = f.read()
            except FileNotFoundError:
                continue
            if data not in versions:
                bad.append(f"{len(data)} bytes that are neither version")
            elif size != len(data):
                bad.append(f"fstat {size} for {versions[data]} ({len(data)} bytes)")
            else:
                seen.append(versions[data])

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        publish(a / name, v2)
        wait_for(lambda: check(seen[-3:] == ["v2"] * 3))
        assert os.stat(b / name).st_size == len(v2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad[:5]
    assert head + old.read() == v1 and os.fstat(old.fileno()).st_size == len(v1)
    old.close()


def subprocess_json(*argv: str) -> dict:
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "kvfs.tools.cli", *argv, "--json"], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_s44_reserved_names_are_refused_and_never_reach_the_shared_tiers(two_mounts, tmp_path):
    """Issue 20, item 14: a block named .kvfs-tmp.* was listed on its own node, skipped by
    the other's listing (the posix tier hides its temporaries) and fair game for its
    stale-temporary cleanup and kvfs gc. Names with a component starting with .kvfs- are
    kvfs's own: every way of creating one is EINVAL (InvalidName on the client), and one
    found in a shared tier (another writer's temporary) is never a block."""
    from kvfs.client import Client
    from kvfs.errors import InvalidName

    a, b = two_mounts
    (a / "d").mkdir()

    def refused(fn, *args) -> int:
        with pytest.raises(OSError) as info:
            fn(*args)
        return info.value.errno

    def write(path: Path) -> None:
        with open(path, "wb") as f:
            f.write(b"x" * 1000)

    assert refused(write, a / ".kvfs-tmp.top") == errno.EINVAL
    assert refused(write, a / "d" / ".kvfs-tmp.blk.0123456789abcdef") == errno.EINVAL
    assert refused(write, a / "d" / ".kvfs-anything") == errno.EINVAL
    assert refused(os.mkdir, a / ".kvfs-dir") == errno.EINVAL
    publish(a / "d" / "ok", b"ok" * 100)
    assert refused(os.rename, a / "d" / "ok", a / "d" / ".kvfs-tmp.ok") == errno.EINVAL
    with open(a / "d" / "open", "wb") as f:  # a file still being written moves with its name: refused too
        f.write(b"y")
        assert refused(os.rename, a / "d" / "open", a / "d" / ".kvfs-tmp.open") == errno.EINVAL
    with Client(a, write=True) as c:
        with pytest.raises(InvalidName, match="reserved for kvfs's own"):  # a put reserves all or none
            c.put(["d/.kvfs-tmp.c", "d/c"], [b"z" * 100, b"c" * 100])
        c.put(["d/c"], [b"c" * 100])
    assert sorted(os.listdir(a / "d")) == ["c", "ok", "open"]
    wait_for(lambda: check(sorted(os.listdir(b / "d")) == ["c", "ok", "open"]))  # both nodes list the same
    # another writer's temporary in the posix directory is never a block here
    shard = tmp_path / "lustre" / "blocks" / "d"
    wait_for(lambda: check((shard / "ok").exists()))
    (shard / ".kvfs-tmp.ok.feedfacefeedface").write_bytes((shard / "ok").read_bytes())
    for node in (a, b):
        assert refused(os.stat, node / "d" / ".kvfs-tmp.ok.feedfacefeedface") == errno.ENOENT
        assert ".kvfs-tmp.ok.feedfacefeedface" not in os.listdir(node / "d")
    assert (b / "d" / "ok").read_bytes() == b"ok" * 100
