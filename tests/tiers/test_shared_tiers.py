"""What is particular to the shared tiers (posix, s3); the Tier contract itself is checked
by tests/tiers/test_tier_conformance.py, where both are parameters.

S3 runs against a real HTTP endpoint: moto's server on 127.0.0.1 (tests/support/s3server.py).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from kvfs.blockfile import checksum
from kvfs.config import PosixConfig, S3Config
from kvfs.errors import BlockCorrupt, BlockNotFound, TierUnavailable
from kvfs.names import TierName
from kvfs.tiers.posix import TMP_PREFIX, PosixOps, PosixTier

from support.deadlines import HANG, TIER_TIMEOUT
from support.s3server import moto  # noqa: F401 - moto is a fixture


def new_bucket(moto) -> str:
    name = f"kvfs-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=name)
    return name


def s3_config(moto, bucket, **kw) -> S3Config:
    kw.setdefault("timeout", TIER_TIMEOUT)
    kw.setdefault("max_attempts", 2)
    return S3Config(
        name=TierName("s3"), capacity=None, bucket=bucket, prefix="kv", endpoint_url=moto.endpoint_url, **kw
    )


def corrupt_copy(tier, name: str) -> None:
    """Flip payload bytes of the stored copy, behind the tier's back."""
    if isinstance(tier, PosixTier):
        path = tier.dir.path(name)
        with open(path, "r+b") as f:
            f.seek(4096)
            b = f.read(16)
            f.seek(4096)
            f.write(bytes(x ^ 0xFF for x in b))
    else:
        c, key = tier.client, tier.key(name)
        obj = c.get_object(Bucket=tier.bucket, Key=key)
        body = bytearray(obj["Body"].read())
        body[4096:4112] = bytes(x ^ 0xFF for x in body[4096:4112])
        c.put_object(Bucket=tier.bucket, Key=key, Body=bytes(body), Metadata=obj["Metadata"])


@pytest.fixture(params=["posix", "s3"])
def tier(request, tmp_path):
    if request.param == "posix":
        t = PosixTier(
            PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=tmp_path / "shared", timeout=TIER_TIMEOUT)
        )
    else:
        from kvfs.tiers.s3 import S3Tier

        moto = request.getfixturevalue("moto")
        t = S3Tier(s3_config(moto, new_bucket(moto)))
    yield t
    t.close()


def put(tier, name: str, data: bytes) -> None:
    tier.put(name, data, checksum(data))


# -- the Tier contract ------------------------------------------------------------------


def test_flags(tier):
    assert tier.persistent and tier.shared


def test_corrupt_copy_is_never_returned(tier):
    data = os.urandom(9000)
    put(tier, "c/blk", data)
    corrupt_copy(tier, "c/blk")
    with pytest.raises(BlockCorrupt):
        tier.open("c/blk")
    with pytest.raises(BlockCorrupt):
        tier.read_into("c/blk", bytearray(9000))


def test_concurrent_publishers_of_one_name(tier):
    """Many writers of the same (content-addressed) name: every read is one whole block."""
    data = os.urandom(50_000)
    errors = []

    def writer():
        try:
            for _ in range(5):
                put(tier, "same/name", data)
                with tier.open("same/name") as ref:
                    assert bytes(ref.data) == data
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [i.name for i in tier.scan("same")] == ["same/name"]


# -- posix ------------------------------------------------------------------------------


def posix(tmp_path, **kw) -> PosixTier:
    kw.setdefault("timeout", TIER_TIMEOUT)  # a healthy call under load is never cut: only a test's stall is
    return PosixTier(PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=tmp_path / "shared", **kw))


def test_posix_publishes_by_rename_in_the_same_directory(tmp_path, monkeypatch):
    """What the tier's helper process runs for a write (PosixOps.write), run here to watch it."""
    ops = PosixOps(str(tmp_path / "shared"), True)
    renames = []
    real = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: (renames.append((a, b)), real(a, b)))
    ops.write("ns/ab/abc", b"x", checksum(b"x"))
    ((src, dst),) = renames
    assert os.path.dirname(src) == os.path.dirname(dst) == str(tmp_path / "shared" / "blocks" / "ns/ab")
    assert os.path.basename(src).startswith(TMP_PREFIX)
    t = posix(tmp_path)  # and the tier, through its helper, reads what was published
    with t.open("ns/ab/abc") as ref:
        assert bytes(ref.data) == b"x"
    t.close()


def test_posix_ignores_other_nodes_temporaries(tmp_path):
    t = posix(tmp_path)
    put(t, "ns/ab/abc", b"x")
    (t.dir.blocks / "ns/ab" / f"{TMP_PREFIX}abd.1234").write_bytes(b"half a block")
    assert [i.name for i in t.scan()] == ["ns/ab/abc"]
    assert t.listdir("ns/ab") == {"abc": False}
    assert t.clean_stale_tmp(older_than=3600) == 0
    assert t.clean_stale_tmp(older_than=-1) == 1
    t.close()


def test_posix_two_nodes_see_each_other(tmp_path):
    a, b = posix(tmp_path), posix(tmp_path)
    put(a, "x/y", b"from a")
    with b.open("x/y") as ref:
        assert bytes(ref.data) == b"from a"
    a.delete("x/y")
    assert b.stat("x/y") is None
    with pytest.raises(BlockNotFound):
        b.open("x/y")
    a.close(), b.close()


def test_posix_hung_filesystem_times_out(tmp_path):
    """A real filesystem that stops answering (tools/stallfs.py): each call gives up after
    the deadline, not before (more calls than the pool admits too), the tier answers again
    once it does, and a call stuck in the kernel holds the tier's helper process, not this one.

    The healthy calls (the tier's start, the put) run under the suite's long timeout: under
    load a round trip through stallfs and the helper took more than the 0.3 s the whole
    tier used to have. Only the calls this test stalls get the short deadline."""
    from kvfs.tools.stallfs import StallingMount

    stalled_timeout = 0.3
    with StallingMount(tmp_path / "stall") as st:
        t = PosixTier(
            PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=st.mountpoint, timeout=TIER_TIMEOUT, concurrency=1)
        )
        assert t._helper.timeout == TIER_TIMEOUT  # the config's deadline is the helper's
        put(t, "h/1", b"x")
        t._helper.timeout = stalled_timeout
        st.stall()
        for _ in range(4):  # the first call is stuck in the helper; the others are not admitted
            start = time.monotonic()
            with pytest.raises(TierUnavailable, match="posix tier 'nfs'"):
                t.open("h/1")
            assert stalled_timeout <= time.monotonic() - start < HANG  # after the deadline: bounded, not early
        assert t._helper.pid != os.getpid() and os.path.exists(f"/proc/{t._helper.pid}")
        t._helper.timeout = TIER_TIMEOUT
        st.resume()
        with t.open("h/1") as ref:  # the stuck call ends and frees its slot; the tier answers again
            assert bytes(ref.data) == b"x"
        t.close()


def test_posix_unusable_path_is_unavailable(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(TierUnavailable, match="cannot use"):
        PosixTier(PosixConfig(name=TierName("nfs"), capacity=1 << 20, path=tmp_path / "file" / "sub"))


# -- s3 ---------------------------------------------------------------------------------


def test_s3_object_layout_and_metadata(moto):
    from kvfs.tiers.s3 import S3Tier

    bucket = new_bucket(moto)
    t = S3Tier(s3_config(moto, bucket))
    data = os.urandom(5000)
    put(t, "ns/ab/abc", data)
    c = moto.client()
    head = c.head_object(Bucket=bucket, Key="kv/ns/ab/abc")
    assert head["ContentLength"] == 4096 + 5000
    assert head["Metadata"] == {"kvfs-length": "5000", "kvfs-checksum": f"{checksum(data):016x}"}
    # an object without our metadata is stat'ed from its header
    body = c.get_object(Bucket=bucket, Key="kv/ns/ab/abc")["Body"].read()
    c.put_object(Bucket=bucket, Key="kv/ns/ab/abc", Body=body)
    assert t.stat("ns/ab/abc").checksum == checksum(data)
    c.put_object(Bucket=bucket, Key="kv/junk", Body=b"not a block")
    assert t.stat("junk") is None
    t.close()


def test_s3_multipart(moto):
    from kvfs.tiers.s3 import S3Tier

    t = S3Tier(s3_config(moto, new_bucket(moto), multipart_threshold=5 << 20))
    calls = []
    real = t.client.upload_part
    t.client.upload_part = lambda **kw: (calls.append(kw["PartNumber"]), real(**kw))[1]
    data = os.urandom(11 << 20)
    put(t, "big", data)
    assert calls == [1, 2, 3]
    with t.open("big") as ref:
        assert bytes(ref.data) == data
    t.close()


def test_s3_error_table(moto):
    from botocore.exceptions import ClientError

    from kvfs.tiers.s3 import S3Tier, translate

    t = S3Tier(s3_config(moto, "kvfs-no-such-bucket"))
    with pytest.raises(TierUnavailable, match=r"the bucket does not exist \(NoSuchBucket\)"):
        t.put("a", b"x", checksum(b"x"))
    t.close()
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "GetObject")
    err = translate(denied, "s3 tier 's3': read of a")
    assert isinstance(err, TierUnavailable) and "access denied" in str(err)
    slow = ClientError({"Error": {"Code": "SlowDown", "Message": "x"}}, "PutObject")
    assert str(translate(slow, "w")) == "w: throttled (SlowDown) after every retry (SlowDown)"
    assert isinstance(translate(ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject"), "r"), BlockNotFound)


def test_s3_throttling_is_retried(moto):
    """503 SlowDown answers are retried with backoff; the call succeeds when S3 recovers."""
    from kvfs.tiers.s3 import S3Tier

    t = S3Tier(s3_config(moto, new_bucket(moto), max_attempts=4))
    answers = iter([503, 503])

    def throttle(request, **kw):
        status = next(answers, None)
        if status is None:
            return None
        from botocore.awsrequest import AWSResponse

        class Raw:
            def stream(self, *a, **k):
                yield b"<Error><Code>SlowDown</Code><Message>slow</Message></Error>"

        return AWSResponse(request.url, status, {}, Raw())

    t.client.meta.events.register("before-send.s3.PutObject", throttle)
    put(t, "t", b"x")  # two throttled answers, then through
    assert next(answers, "done") == "done"
    with t.open("t") as ref:
        assert bytes(ref.data) == b"x"
    t.close()


def test_s3_server_down_fails_fast_and_recovers(moto):
    from kvfs.tiers.s3 import S3Tier

    # the deadline also bounds the healthy put and the read after the restart, which a
    # loaded machine may keep past 1 s; a stopped endpoint refuses the connection at once
    t = S3Tier(s3_config(moto, new_bucket(moto), timeout=5.0, max_attempts=2))
    put(t, "d", b"x")
    moto.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(TierUnavailable, match="cannot connect to the endpoint"):
            t.open("d")
        assert time.monotonic() - t0 < HANG  # cut at the tier's deadline, not boto's
    finally:
        moto.start()
    with t.open("d") as ref:
        assert bytes(ref.data) == b"x"
    t.close()
