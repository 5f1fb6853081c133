"""The conformance suite every tier passes. A new tier adds a factory to TIER_FACTORIES.

Each factory takes pytest's ``tmp_path`` and ``request`` and returns an open tier with
at least 64 MiB of capacity; the suite closes it.
"""

from __future__ import annotations

import os
import threading

import pytest

from kvfs.blockfile import checksum
from kvfs.config import DiskConfig, DramConfig
from kvfs.errors import BlockCorrupt, BlockNotFound
from kvfs.names import TierName
from kvfs.pieces import Pieces
from kvfs.tier import BlockInfo, Tier

from support.deadlines import TIER_TIMEOUT
from support.s3server import moto  # noqa: F401 - the moto S3 server fixture, used by the s3 factory


def _dram(tmp_path, request) -> Tier:
    from kvfs.tiers.dram import DramTier

    return DramTier(DramConfig(name=TierName("dram"), capacity=64 << 20, path=None))


def _disk(tmp_path, request) -> Tier:
    from kvfs.tiers.disk import DiskTier

    return DiskTier(DiskConfig(name=TierName("disk"), capacity=256 << 20, path=tmp_path / "disk"))


def _disk_direct(tmp_path, request) -> Tier:
    from kvfs.tiers.disk import DiskTier

    return DiskTier(DiskConfig(name=TierName("disk"), capacity=256 << 20, path=tmp_path / "disk", direct_io=True))


def _posix(tmp_path, request) -> Tier:
    from kvfs.config import PosixConfig
    from kvfs.tiers.posix import PosixTier

    return PosixTier(
        PosixConfig(name=TierName("posix"), capacity=1 << 30, path=tmp_path / "shared", timeout=TIER_TIMEOUT)
    )


def _s3(tmp_path, request) -> Tier:
    """An S3 tier on a fresh bucket of the moto server (a real HTTP endpoint on 127.0.0.1)."""
    import uuid

    from kvfs.config import S3Config
    from kvfs.tiers.s3 import S3Tier

    server = request.getfixturevalue("moto")
    bucket = f"kvfs-{uuid.uuid4().hex[:12]}"
    server.client().create_bucket(Bucket=bucket)
    return S3Tier(
        S3Config(
            name=TierName("s3"),
            capacity=None,
            bucket=bucket,
            prefix="kv",
            endpoint_url=server.endpoint_url,
            timeout=TIER_TIMEOUT,
            max_attempts=2,
        )
    )


TIER_FACTORIES = {
    "dram": _dram,
    "disk": _disk,
    "disk-direct": _disk_direct,
    "posix": _posix,
    "s3": _s3,
}


@pytest.fixture(params=sorted(TIER_FACTORIES))
def tier(request, tmp_path):
    t = TIER_FACTORIES[request.param](tmp_path, request)
    yield t
    t.close()


def _put(tier: Tier, name: str, data: bytes) -> None:
    tier.put(name, data, checksum(data))


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, (2 << 20) + 7])
def test_put_open_roundtrip(tier, size):
    data = os.urandom(size)
    _put(tier, "ns/ab/block", data)
    with tier.open("ns/ab/block") as ref:
        assert bytes(ref.data) == data
        assert ref.checksum == checksum(data)
    assert tier.stat("ns/ab/block") == BlockInfo("ns/ab/block", size, checksum(data))


# a block's bytes in pieces, as a seal through the mount hands them over (kvfs.pieces):
# whole 1 MiB chunks, a short last one, a base's slice, zeros of a hole, odd sizes
_SPLITS = {
    "one": [5 << 10],
    "chunks": [1 << 20, 1 << 20],
    "short-last": [1 << 20, 1 << 20, 4097],
    "odd": [3, 4093, 1, 65536 + 7, 0, 12345],
    "empty": [],
}


@pytest.mark.parametrize("split", sorted(_SPLITS))
def test_put_from_pieces_is_the_joined_block(tier, split):
    sizes = _SPLITS[split]
    parts = [os.urandom(n) for n in sizes]
    if len(parts) > 2:
        parts[1] = bytes(len(parts[1]))  # a hole's zeros
        parts[2] = memoryview(bytearray(parts[2]))  # a patched chunk, not a bytes
    joined = b"".join(parts)
    pieces = Pieces(parts)
    assert len(pieces) == len(joined) and checksum(pieces) == checksum(joined)
    tier.put("ns/p/pieces", pieces, checksum(pieces))
    _put(tier, "ns/p/joined", joined)
    for name in ("ns/p/pieces", "ns/p/joined"):
        with tier.open(name) as ref:
            assert bytes(ref.data) == joined and ref.checksum == checksum(joined)
        assert tier.stat(name) == BlockInfo(name, len(joined), checksum(joined))


def test_read_into(tier):
    data = os.urandom(100_000)
    _put(tier, "x", data)
    out = bytearray(200_000)
    assert tier.read_into("x", out) == (len(data), checksum(data))
    assert bytes(out[: len(data)]) == data
    with pytest.raises(ValueError, match="too small"):
        tier.read_into("x", bytearray(10))


def test_missing_block(tier):
    with pytest.raises(BlockNotFound):
        tier.open("nope")
    assert tier.stat("nope") is None
    tier.delete("nope")  # deleting a missing block is not an error


def test_replace_keeps_old_readers(tier):
    a, b = os.urandom(50_000), os.urandom(60_000)
    _put(tier, "r", a)
    ref = tier.open("r")
    _put(tier, "r", b)
    with tier.open("r") as new:
        assert bytes(new.data) == b
    assert bytes(ref.data) == a  # the old reader keeps the old bytes
    ref.release()


def _bytes_at(loc) -> bytes:
    fd = os.open(loc.path, os.O_RDONLY)
    try:
        return os.pread(fd, loc.length, loc.offset)
    finally:
        os.close(fd)


def test_open_located_holds_the_copy_it_locates(tier):
    """``open_located`` (a lease's hold) is ``open`` and ``locate`` of one copy: the
    location names the bytes the ref holds, and a replacement is located anew (DRAM keeps
    a location per extent, never per name)."""
    a, b = os.urandom(50_000), os.urandom(60_000)
    _put(tier, "r", a)
    ref, loc = tier.open_located("r", len(a))
    assert bytes(ref.data) == a
    assert loc == tier.locate("r", len(a))
    if loc is not None:
        assert loc.length == len(a) and _bytes_at(loc) == a
    _put(tier, "r", b)
    new, loc2 = tier.open_located("r", len(b))
    assert bytes(new.data) == b and bytes(ref.data) == a  # the old holder keeps the old copy
    if loc2 is not None:
        assert loc2.length == len(b) and _bytes_at(loc2) == b
        if tier.keeps_held:  # an extent held is never reused: the old one still holds a
            assert loc is not None and loc2.offset != loc.offset and _bytes_at(loc) == a
    ref.release()
    new.release()
    tier.delete("r")
    with pytest.raises(BlockNotFound):
        tier.open_located("r", len(b))


def test_delete(tier):
    _put(tier, "d/x", b"hello")
    tier.delete("d/x")
    with pytest.raises(BlockNotFound):
        tier.open("d/x")


def test_rename_replaces(tier):
    a, b = os.urandom(5000), os.urandom(7000)
    _put(tier, "src", a)
    _put(tier, "dst/deep/name", b)
    tier.rename("src", "dst/deep/name")
    with pytest.raises(BlockNotFound):
        tier.open("src")
    with tier.open("dst/deep/name") as ref:
        assert bytes(ref.data) == a


def test_scan(tier):
    blobs = {f"ns/{i:02x}/b{i}": os.urandom(1000 + i) for i in range(20)}
    for n, d in blobs.items():
        _put(tier, n, d)
    found = {info.name: info for info in tier.scan()}
    assert set(found) == set(blobs)
    for n, d in blobs.items():
        assert found[n].size == len(d) and found[n].checksum == checksum(d)
    assert {i.name for i in tier.scan("ns/03")} == {"ns/03/b3"}


def test_listdir(tier):
    for n in ("m/aa/1", "m/aa/2", "m/bb/3", "other/4"):
        _put(tier, n, n.encode())
    assert tier.listdir("") == {"m": True, "other": True}
    assert tier.listdir("m") == {"aa": True, "bb": True}
    assert tier.listdir("m/aa") == {"1": False, "2": False}
    assert tier.listdir("nothing") == {}


def test_footprint_covers_size(tier):
    for size in (0, 1, 4096, 1 << 20):
        assert tier.footprint("n", size) >= size


def test_concurrent_put_and_read(tier):
    names = [f"c/{i}" for i in range(8)]
    datas = {n: [os.urandom(64 << 10) for _ in range(3)] for n in names}
    for n in names:
        _put(tier, n, datas[n][0])
    errors: list[str] = []

    def writer(n):
        for d in datas[n] * 5:
            _put(tier, n, d)

    def reader(n):
        for _ in range(30):
            with tier.open(n) as ref:
                if bytes(ref.data) not in datas[n]:
                    errors.append(n)

    threads = [threading.Thread(target=f, args=(n,)) for n in names for f in (writer, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_persistent_copy_flip_is_detected(tier, tmp_path):
    if not tier.persistent or tier.kind.value != "disk":
        pytest.skip("byte flipping is specific to file-backed tiers; shared tiers test it in their own suite")
    data = os.urandom(10_000)
    _put(tier, "f/x", data)
    path = tmp_path / "disk" / "blocks" / "f" / "x"
    raw = bytearray(path.read_bytes())
    raw[4096 + 1234] ^= 0x40
    path.write_bytes(raw)
    with pytest.raises(BlockCorrupt):
        tier.open("f/x")
    with pytest.raises(BlockCorrupt):
        tier.read_into("f/x", bytearray(20_000))


def test_a_directory_name_is_not_a_block(tier):
    _put(tier, "dir/sub/x", b"data")
    assert tier.stat("dir/sub") is None
    assert tier.stat("dir") is None
    with pytest.raises(BlockNotFound):
        tier.open("dir/sub")
