"""Two kvfs nodes sharing a posix directory and an S3 bucket (issue 4).

The FUSE mount (a ``kvfs_mount`` fixture) was not on main when this was written, so the
two nodes are two :class:`~kvfs.store.Store` instances in one process, each with its own
DRAM arena and disk directory, sharing one posix directory and one bucket on a moto S3
server on 127.0.0.1. The store is the layer the mount delegates to; when the mount lands,
these scenarios should also run through two real mounts.

A fake clock drives the negative-cache and listing TTLs and the unhealthy-tier retry, so
the tests wait for real only on real timeouts. The nodes wait for the background work on
the shared tiers they start (``shared_wait``), so each step sees its outcome; the daemon
never waits (tests/tiers/test_faults.py checks that side).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import pytest
import xxhash

from kvfs.config import DiskConfig, DramConfig, PosixConfig, S3Config
from kvfs.errors import BlockNotFound, TierUnavailable
from kvfs.names import TierName
from kvfs.store import Store
from kvfs.tiers import open_tier

from support.deadlines import HANG, TIER_TIMEOUT
from support.s3server import MotoS3, moto  # noqa: F401 - moto is a fixture

TTL = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Cluster:
    """Two nodes over one shared directory and one bucket."""

    def __init__(self, root: Path, moto: MotoS3, *, timeout: float = TIER_TIMEOUT, max_attempts: int = 2) -> None:
        self.moto = moto
        self.bucket = f"kvfs-{uuid.uuid4().hex[:12]}"
        moto.client().create_bucket(Bucket=self.bucket)
        self.clock = Clock()
        self.shared_dir = root / "lustre"
        self.nodes = [self._node(root / n, timeout, max_attempts) for n in ("a", "b")]

    def _node(self, root: Path, timeout: float, max_attempts: int) -> Store:
        configs = [
            DramConfig(name=TierName("dram"), capacity=16 << 20, prefault=False, mlock=False),
            DiskConfig(name=TierName("disk"), capacity=64 << 20, path=root / "disk"),
            PosixConfig(name=TierName("posix"), capacity=1 << 30, path=self.shared_dir, timeout=timeout),
            S3Config(
                name=TierName("s3"),
                capacity=None,
                bucket=self.bucket,
                prefix="kv",
                endpoint_url=self.moto.endpoint_url,
                timeout=timeout,
                max_attempts=max_attempts,
            ),
        ]
        return Store(
            [open_tier(c) for c in configs], clock=self.clock, negative_ttl=TTL, listing_ttl=5.0, shared_wait=30.0
        )

    def close(self) -> None:
        for n in self.nodes:
            n.close()


@pytest.fixture
def cluster(tmp_path, moto):
    c = Cluster(tmp_path, moto)
    yield c
    c.close()


def data_for(name: str, size: int = 20_000) -> bytes:
    """Deterministic bytes per name, like a content-addressed block."""
    seed = xxhash.xxh3_64_intdigest(name.encode())
    return random.Random(seed).randbytes(size)


def stats(store: Store, tier: str):
    return store.statistics().tiers[store.tier_index(tier)]


def test_block_written_on_a_reads_byte_exact_on_b_and_is_promoted(cluster):
    a, b = cluster.nodes
    data = data_for("m/ab/abc")
    a.put("m/ab/abc", data)
    assert a.stat("m/ab/abc").tiers == ("dram",)
    assert a.run_pending() == 2  # write-through (the default) to posix and s3
    assert a.stat("m/ab/abc").tiers == ("dram", "posix", "s3")
    assert b.read("m/ab/abc") == data
    assert b.stat("m/ab/abc").tiers == ("dram", "posix", "s3")  # promoted into B's DRAM
    assert stats(b, "dram").promotions == 1 and stats(b, "posix").hits == 1
    assert b.read("m/ab/abc") == data
    assert stats(b, "dram").hits == 1


def test_a_miss_is_remembered_for_the_negative_ttl(cluster, monkeypatch):
    a, b = cluster.nodes
    calls = []
    s3 = b.tiers[b.tier_index("s3")]
    real = s3.stat
    monkeypatch.setattr(s3, "stat", lambda n: (calls.append(n), real(n))[1])
    assert b.lookup("m/ab/new") is None
    assert b.lookup("m/ab/new") is None
    assert calls == ["m/ab/new"]  # the second miss did not ask S3
    a.put("m/ab/new", b"x")
    a.run_pending()
    assert b.lookup("m/ab/new") is None  # still cached
    cluster.clock.advance(TTL + 0.1)
    assert b.lookup("m/ab/new").tiers == ("posix", "s3")
    assert b.read("m/ab/new") == b"x"


def test_a_block_removed_on_a_reads_missing_on_b_once_the_ttl_passed(cluster):
    a, b = cluster.nodes
    a.put("m/ab/gone", data_for("gone"))
    a.run_pending()
    assert b.read("m/ab/gone") == data_for("gone")  # B now holds it in its DRAM too
    a.delete("m/ab/gone")
    for store in cluster.nodes:
        assert store.tiers[store.tier_index("posix")].stat("m/ab/gone") is None
        assert store.tiers[store.tier_index("s3")].stat("m/ab/gone") is None
    assert b.read("m/ab/gone") == data_for("gone")  # within the TTL B may still serve it
    cluster.clock.advance(TTL + 0.1)
    with pytest.raises(BlockNotFound):
        b.read("m/ab/gone")
    assert stats(b, "dram").blocks == 0  # B dropped its local copy
    assert "gone" not in b.listdir("m/ab")


def test_delete_of_a_block_only_seen_through_shared_tiers(cluster):
    a, b = cluster.nodes
    a.put("m/cd/x", b"x")
    a.run_pending()
    b.delete("m/cd/x")  # B never read it: found by stat, removed from both shared tiers
    assert a.tiers[2].stat("m/cd/x") is None and a.tiers[3].stat("m/cd/x") is None
    cluster.clock.advance(TTL + 0.1)
    assert a.lookup("m/cd/x") is None


def test_listings_include_shared_blocks_and_are_cached(cluster, monkeypatch):
    a, b = cluster.nodes
    for k in range(5):
        a.put(f"ns/ab/blk{k}", b"x")
    a.put("ns/cd/blk9", b"x")
    a.run_pending()
    assert b.listdir("") == {"ns": True}
    assert b.is_dir("ns") and b.is_dir("ns/ab") and not b.is_dir("ns/ab/blk1")
    assert b.listdir("ns") == {"ab": True, "cd": True}
    assert b.listdir("ns/ab") == {f"blk{k}": False for k in range(5)}
    s3 = b.tiers[3]
    calls = []
    real = s3.listdir
    monkeypatch.setattr(s3, "listdir", lambda d: (calls.append(d), real(d))[1])
    a.put("ns/ab/blk5", b"x")
    a.run_pending()
    assert "blk5" not in b.listdir("ns/ab") and calls == []  # served from the cache
    cluster.clock.advance(5.1)
    assert "blk5" in b.listdir("ns/ab") and calls == ["ns/ab"]
    assert b.stat("ns/ab/blk5").size == 1


def test_eight_threads_per_node_lose_nothing_and_never_see_partial_blocks(cluster):
    a, b = cluster.nodes
    names = [f"ns/{k % 7:02x}/blk{k}" for k in range(48)]
    written: set[str] = set()
    bad: list[str] = []
    stop = threading.Event()

    def worker(store: Store, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(60):
                name = rng.choice(names)
                if rng.random() < 0.4:
                    store.put(name, data_for(name, 4096 + 512 * (hash(name) % 8)))
                    written.add(name)
                else:
                    try:
                        got = store.read(name)
                    except BlockNotFound:
                        continue
                    if got != data_for(name, len(got)) or len(got) != 4096 + 512 * (hash(name) % 8):
                        bad.append(f"{name}: {len(got)} bytes, wrong content")
        except Exception as exc:
            bad.append(repr(exc))

    def background(store: Store) -> None:  # the daemon's write-through task
        while not stop.is_set():
            if not store.run_pending(8):
                time.sleep(0.005)

    bg = [threading.Thread(target=background, args=(s,)) for s in cluster.nodes]
    workers = [
        threading.Thread(target=worker, args=(s, 100 * n + t)) for n, s in enumerate(cluster.nodes) for t in range(8)
    ]
    for t in bg + workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in bg:
        t.join()
    for s in cluster.nodes:
        s.run_pending()
    assert not bad
    cluster.clock.advance(TTL + 0.1)  # forget misses cached during the run
    for name in sorted(written):
        for s in cluster.nodes:
            assert s.read(name) == data_for(name, 4096 + 512 * (hash(name) % 8)), name


# -- faults ------------------------------------------------------------------------------


def flip_s3_object(cluster, name: str) -> None:
    c = cluster.moto.client()
    key = f"kv/{name}"
    obj = c.get_object(Bucket=cluster.bucket, Key=key)
    body = bytearray(obj["Body"].read())
    body[5000] ^= 0x01
    c.put_object(Bucket=cluster.bucket, Key=key, Body=bytes(body), Metadata=obj["Metadata"])


def test_a_flipped_s3_object_is_never_returned(cluster):
    a, b = cluster.nodes
    data = data_for("f/s3only")
    a.put("f/s3only", data)
    a.run_pending()
    a.tiers[2].delete("f/s3only")  # leave the S3 copy only
    flip_s3_object(cluster, "f/s3only")
    with pytest.raises(BlockNotFound):
        b.read("f/s3only")
    assert stats(b, "s3").corrupt == 1
    assert b.lookup("f/s3only") is None


def test_a_bad_shared_copy_falls_back_to_the_next(cluster):
    a, b = cluster.nodes
    data = data_for("f/both")
    a.put("f/both", data)
    a.run_pending()
    path = a.tiers[2].dir.path("f/both")  # flip a payload byte of the posix copy
    with open(path, "r+b") as f:
        f.seek(4096 + 7)
        byte = f.read(1)
        f.seek(4096 + 7)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert b.read("f/both") == data  # from S3
    assert stats(b, "posix").corrupt == 1 and stats(b, "s3").hits == 1


@pytest.mark.parametrize("fault", ["stopped", "stalled"])
def test_s3_down_degrades_the_tier_not_the_store(tmp_path, moto, fault):
    # the deadline bounds the healthy calls too (the puts, the write-through, the read from
    # a just-restarted moto), which a loaded machine may keep past 1 s: 3 s, so the stalled
    # read waits ~3x that, still far below botocore's own (HANG)
    cluster = Cluster(tmp_path, moto, timeout=3.0, max_attempts=2)
    a, b = cluster.nodes
    try:
        a.put("d/s3only", b"only in s3")
        a.put("d/local", b"local on b")
        a.run_pending()
        a.tiers[2].delete("d/s3only")
        assert b.stat("d/s3only").tiers == ("s3",)
        assert b.read("d/local") == b"local on b"  # now also in B's DRAM
        (moto.stop if fault == "stopped" else moto.stall)()
        try:
            t0 = time.monotonic()
            with pytest.raises(TierUnavailable, match="'d/s3only': no readable copy now.*: s3"):
                b.read("d/s3only")
            elapsed = time.monotonic() - t0
            assert elapsed < HANG, elapsed  # bounded by the tier's deadline (~3x 3 s), not boto's
            assert not stats(b, "s3").healthy and stats(b, "s3").errors >= 1
            errors = stats(b, "s3").errors
            assert b.read("d/local") == b"local on b"  # local tiers keep serving
            b.put("d/new", b"written while s3 is down")
            assert b.read("d/new") == b"written while s3 is down"
            assert b.run_pending() >= 1  # posix takes it; s3 is skipped while unhealthy
            # none of that waited on s3: any call to it now fails (a timeout when stalled)
            # and counts (not a timed assertion, which a loaded machine can break)
            assert stats(b, "s3").errors == errors
            with pytest.raises(TierUnavailable):  # unhealthy: fails at once, no new wait
                b.read("d/s3only")
        finally:
            moto.start()
        cluster.clock.advance(5.1)  # the store tries an unhealthy tier again after 5 s
        assert b.read("d/s3only") == b"only in s3"
        assert stats(b, "s3").healthy
        b.run_pending()
        assert "s3" in b.stat("d/new").tiers
    finally:
        cluster.close()
