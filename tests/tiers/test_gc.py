"""``kvfs gc`` on a real posix directory and a real S3 endpoint (moto on 127.0.0.1) with
what crashed writers left (temporaries, unfinished multipart uploads) and retired
namespaces: the dry run, progress, and that it never removes a block written within its
window, even one another node publishes while it runs. docs/tenants.md, "gc"."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest

from kvfs.blockfile import checksum, file_length
from kvfs.config import NamespaceConfig, PosixConfig, S3Config
from kvfs.errors import ConfigError
from kvfs.gc import GcPlan, collect, with_retired
from kvfs.names import TierName
from kvfs.tiers.posix import TMP_PREFIX, PosixTier

from support.cli import run_kvfs
from support.deadlines import TIER_TIMEOUT
from support.s3server import moto  # noqa: F401 - moto is a fixture

HOUR = 3600.0


def put(tier, name: str, data: bytes) -> None:
    tier.put(name, data, checksum(data))


def posix(path) -> PosixTier:
    return PosixTier(PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=path, timeout=TIER_TIMEOUT))


def age(path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture
def crashed_posix(tmp_path):
    """A shared directory with old and young blocks of a retired namespace ("old"), a live
    namespace's blocks, and temporaries of writers that died (old) or are writing (young)."""
    t = posix(tmp_path / "shared")
    for i in range(3):
        put(t, f"old/0{i}/blk{i}", b"stale" * 100)
        age(t.dir.path(f"old/0{i}/blk{i}"), 2 * HOUR)
    put(t, "old/03/fresh", b"another node wrote this a minute ago")
    put(t, "live/00/blk", b"live" * 100)
    age(t.dir.path("live/00/blk"), 5 * HOUR)
    shard = t.dir.blocks / "live" / "00"
    (shard / f"{TMP_PREFIX}blk2.dead1").write_bytes(b"half a block")
    age(shard / f"{TMP_PREFIX}blk2.dead1", 3 * HOUR)
    (shard / f"{TMP_PREFIX}blk3.writing").write_bytes(b"being written now")
    (t.dir.tmp / "orphan").write_bytes(b"x")
    age(t.dir.tmp / "orphan", 2 * HOUR)
    yield t
    t.close()


PLAN = GcPlan(namespaces=(NamespaceConfig(path="old", retired=True), NamespaceConfig(path="live")))


def test_gc_on_a_posix_directory(crashed_posix):
    t = crashed_posix
    seen = []
    dry = collect(t, PLAN, now=time.time(), dry_run=True, progress=lambda n, r: seen.append((n, r)))
    assert sorted(r.name for r in dry.removed) == [
        "blocks/live/00/.kvfs-tmp.blk2.dead1",
        "old/00/blk0",
        "old/01/blk1",
        "old/02/blk2",
        "tmp/orphan",
    ]
    assert dry.young == 2 and dry.scanned == 8 and not dry.failed
    assert seen[-1] == (8, 5) and [n for n, _ in seen] == list(range(1, 9))  # progress per object
    assert all(os.path.exists(t.dir.path(f"old/0{i}/blk{i}")) for i in range(3))  # a dry run removes nothing
    report = collect(t, PLAN, now=time.time())
    assert sorted(r.name for r in report.removed) == sorted(r.name for r in dry.removed)
    assert report.bytes == sum(file_length(f"old/0{i}/blk{i}", 500) for i in range(3)) + len(b"half a block") + 1
    left = sorted(o.name for o in t.inventory())
    assert left == ["blocks/live/00/.kvfs-tmp.blk3.writing", "live/00/blk", "old/03/fresh"]
    assert t.open("old/03/fresh").data == b"another node wrote this a minute ago"
    again = collect(t, PLAN, now=time.time())
    assert again.removed == [] and again.young == 2


def test_retention_of_a_live_namespace_by_write_time_only_with_expired(crashed_posix):
    t = crashed_posix
    plan = GcPlan(namespaces=(NamespaceConfig(path="live", retention=4 * HOUR),), expired=False)
    assert sorted(r.name for r in collect(t, plan, now=time.time(), dry_run=True).removed) == [
        "blocks/live/00/.kvfs-tmp.blk2.dead1",
        "tmp/orphan",
    ]
    plan = GcPlan(namespaces=(NamespaceConfig(path="live", retention=4 * HOUR),), expired=True)
    names = [r.name for r in collect(t, plan, now=time.time(), dry_run=True).removed]
    assert "live/00/blk" in names  # written 5 h ago, retention 4 h


def test_expire_never_removes_a_block_published_again_meanwhile(tmp_path):
    """Another node re-publishes the block (a fresh file renamed into place) while gc
    expires it: whatever the interleaving, the fresh file is there afterwards."""
    t = posix(tmp_path / "shared")
    other = posix(tmp_path / "shared")
    try:
        for i in range(100):
            name = f"ns/00/b{i}"
            put(t, name, b"old")
            age(t.dir.path(name), 2 * HOUR)
            cutoff = time.time() - HOUR
            go = threading.Barrier(2)

            def publish(name=name, go=go):
                go.wait()
                put(other, name, b"new")

            th = threading.Thread(target=publish)
            th.start()
            go.wait()
            t.expire(name, cutoff)
            th.join()
            assert os.path.exists(t.dir.path(name)), i
            assert os.stat(t.dir.path(name)).st_mtime >= cutoff, i
        assert not [o for o in t.inventory() if o.leftover]  # nothing left aside
    finally:
        other.close()
        t.close()


def test_a_retired_path_from_the_command_line():
    spaces = with_retired((NamespaceConfig(path="a", retention=60.0),), ["/a/", "b"])
    assert [(n.path, n.retired, n.retention) for n in spaces] == [("a", True, 60.0), ("b", True, None)]
    with pytest.raises(ConfigError, match="nest"):
        with_retired((NamespaceConfig(path="a"),), ["a/x"])


# -- S3 ---------------------------------------------------------------------------------------


@pytest.fixture
def bucket(moto):
    name = f"kvfs-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=name)
    return name


def s3_tier(moto, bucket):
    from kvfs.tiers.s3 import S3Tier

    return S3Tier(
        S3Config(
            name=TierName("s3"),
            capacity=None,
            bucket=bucket,
            prefix="kv",
            endpoint_url=moto.endpoint_url,
            timeout=TIER_TIMEOUT,
        )
    )


def crashed_upload(moto, bucket, key: str) -> str:
    """A multipart upload a writer started and never finished (it died)."""
    c = moto.client()
    up = c.create_multipart_upload(Bucket=bucket, Key=key)
    c.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"p" * (5 << 20))
    return up["UploadId"]


def test_gc_on_a_bucket(moto, bucket):
    t = s3_tier(moto, bucket)
    try:
        for i in range(3):
            put(t, f"old/0{i}/blk{i}", b"stale" * 100)
        put(t, "live/00/blk", b"live")
        crashed_upload(moto, bucket, "kv/live/00/big")
        crashed_upload(moto, bucket, "kv/old/09/big")
        crashed_upload(moto, bucket, "elsewhere/not-ours")  # outside the tier's prefix: never touched
        now = time.time()
        young = collect(t, PLAN, now=now + 0.5 * HOUR, dry_run=True)  # the blocks are younger than an hour
        # (moto reports every upload as initiated in 2010, so the uploads are old to gc here)
        assert sorted(r.name for r in young.removed) == ["live/00/big", "old/09/big"]
        assert young.young == 3 and young.scanned == 6
        later = now + 2 * HOUR
        dry = collect(t, PLAN, now=later, dry_run=True)
        assert sorted((r.name, r.why.split(" ")[0]) for r in dry.removed) == [
            ("live/00/big", "leftover"),
            ("old/00/blk0", "namespace"),
            ("old/01/blk1", "namespace"),
            ("old/02/blk2", "namespace"),
            ("old/09/big", "leftover"),
        ]
        report = collect(t, PLAN, now=later)
        assert len(report.removed) == 5 and not report.failed
        c = moto.client()
        keys = sorted(o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", []))
        assert keys == ["kv/live/00/blk"]
        uploads = [u["Key"] for u in c.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
        assert uploads == ["elsewhere/not-ours"]
    finally:
        t.close()


def test_s3_expire_keeps_an_object_newer_than_the_cutoff_or_replaced_since(moto, bucket):
    t = s3_tier(moto, bucket)
    try:
        put(t, "ns/x", b"v1")
        assert not t.expire("ns/x", time.time() - HOUR)  # written just now
        assert t.expire("ns/x", time.time() + HOUR)
        assert t.stat("ns/x") is None
        assert not t.expire("ns/x", time.time() + HOUR)  # gone already
    finally:
        t.close()


# -- the command ------------------------------------------------------------------------------


def test_kvfs_gc_command(crashed_posix, tmp_path):
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(
        f"""
[[tiers]]
kind = "dram"
capacity = "8MiB"

[[tiers]]
kind = "posix"
name = "nfs"
capacity = "1GiB"
path = "{tmp_path / "shared"}"

[[namespaces]]
path = "old"
retired = true
"""
    )
    res = run_kvfs("gc", "--config", str(cfg), "--dry-run", "--progress")
    assert res.returncode == 0, res.stderr
    assert "WOULD REMOVE" in res.stdout and "nfs: old/00/blk0" in res.stdout
    assert "gc nfs: 8 scanned, 5 to remove" in res.stderr
    assert os.path.exists(crashed_posix.dir.path("old/00/blk0"))
    res = run_kvfs("gc", "--config", str(cfg), "--json")
    out = json.loads(res.stdout)
    assert res.returncode == 0 and out["dry_run"] is False
    [nfs] = out["tiers"]
    assert nfs["tier"] == "nfs" and len(nfs["removed"]) == 5 and nfs["young"] == 2
    assert not os.path.exists(crashed_posix.dir.path("old/00/blk0"))
    res = run_kvfs("gc", "--config", str(cfg), "--retired", "live", "--min-age", "4h", "--json")
    assert [r["name"] for r in json.loads(res.stdout)["tiers"][0]["removed"]] == ["live/00/blk"]
    res = run_kvfs("gc", "--config", str(cfg), "--tier", "dram")
    assert res.returncode == 1 and "no shared tier named 'dram'; shared tiers: nfs" in res.stderr
    res = run_kvfs("gc", "--config", str(cfg), "--tmp-age", "soon")
    assert res.returncode == 2 and res.stderr.startswith("kvfs: gc: argument --tmp-age: 'soon' is not a duration")
