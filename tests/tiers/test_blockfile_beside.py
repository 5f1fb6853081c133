"""Block format version 3: the header beside the payload (docs/block-format.md).

The disk tier writes each block as a file of exactly its payload, the header in the
file's ``user.kvfs.block`` attribute, so the file can back a FUSE file at identical
offsets; files of the older layout (the header first) are still read, renamed, scanned.
``open_file`` hands out a file only once it is known to hold the block's bytes.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from kvfs.blockfile import (
    XATTR,
    beside_fits,
    checksum,
    decode_header,
    devsum,
    encode_beside,
    read_header,
)
from kvfs.errors import BlockCorrupt, BlockNotFound
from kvfs.tiers.blockdir import BlockDirectory


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture(params=[False, True], ids=["buffered", "direct"])
def bdir(request, tmp_path) -> BlockDirectory:
    d = BlockDirectory(tmp_path / "t", direct_io=request.param, beside=True)
    if not d.beside:
        pytest.skip(f"{tmp_path} keeps no user extended attributes")
    return d


def test_the_attribute_holds_a_header_that_checks_itself():
    v = encode_beside("ns/ab/cd", 12345, 77, 9)
    hdr = decode_header(v)
    assert (hdr.version, hdr.name, hdr.length, hdr.checksum, hdr.device_checksum, hdr.header_length) == (
        3,
        "ns/ab/cd",
        12345,
        77,
        9,
        0,
    )
    for i in range(len(v)):
        bad = bytearray(v)
        bad[i] ^= 0x04
        with pytest.raises(BlockCorrupt):
            decode_header(bytes(bad))
    assert beside_fits("n" * 3900) and not beside_fits("n" * 4000)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 2 << 20, (2 << 20) + 3])
def test_a_block_file_is_its_payload_with_the_header_beside(bdir, size):
    data = blob(size, size)
    bdir.write("m/ab/x", data, checksum(data))
    path = bdir.path("m/ab/x")
    assert Path(path).read_bytes() == data  # exactly the payload, from offset 0
    hdr = decode_header(os.getxattr(path, XATTR))
    assert (hdr.version, hdr.length, hdr.checksum, hdr.device_checksum) == (3, size, checksum(data), devsum(data))
    with bdir.read("m/ab/x") as ref:
        assert bytes(ref.data) == data
    out = bytearray(size + 10)
    assert bdir.read_into("m/ab/x", out) == (size, checksum(data)) and bytes(out[:size]) == data
    assert bdir.stat("m/ab/x").size == size
    with bdir.open_file("m/ab/x") as f:
        assert (f.size, f.checksum) == (size, checksum(data))
        assert os.pread(f.fd, size + 10, 0) == data


def test_old_files_with_the_header_first_still_read_rename_and_scan(tmp_path):
    old = BlockDirectory(tmp_path / "t", beside=False)
    data = blob(5000, 1)
    old.write("a/b", data, checksum(data))
    assert Path(old.path("a/b")).read_bytes()[:8] == b"KVFSBLK\x01"  # version 2: the header first
    new = BlockDirectory(tmp_path / "t", beside=True)
    with new.read("a/b") as ref:
        assert bytes(ref.data) == data
    assert new.open_file("a/b") is None  # no file of the payload alone to hand out
    new.rename("a/b", "a/c")
    fd = os.open(new.path("a/c"), os.O_RDONLY)
    try:
        assert read_header(fd).name == "a/c"
    finally:
        os.close(fd)
    assert [(i.name, i.size, i.problem) for i in new.scan()] == [("a/c", 5000, None)]
    with new.read("a/c") as ref:
        assert bytes(ref.data) == data


def test_rename_rewrites_the_attribute_and_scan_completes_an_interrupted_one(bdir):
    data = blob(9000, 2)
    bdir.write("r/1", data, checksum(data))
    bdir.rename("r/1", "r/2")
    assert not os.path.exists(bdir.path("r/1"))
    with bdir.read("r/2") as ref:
        assert bytes(ref.data) == data
    # a crash between the attribute's rewrite and the file's rename: the scan finishes it
    os.setxattr(bdir.path("r/2"), XATTR, encode_beside("r/3", len(data), checksum(data), devsum(data)))
    assert [(i.name, i.problem) for i in bdir.scan()] == [("r/3", None)]
    assert os.path.exists(bdir.path("r/3"))


def test_a_file_changed_behind_the_tier_is_found_bad(bdir):
    data = blob(1 << 20, 3)
    bdir.write("c/1", data, checksum(data))
    with bdir.open_file("c/1") as f:  # written here: handed out without reading it
        assert f.size == len(data)
    with open(bdir.path("c/1"), "r+b") as fh:  # a byte changed in place: its ctime moves
        fh.seek(12345)
        fh.write(bytes([data[12345] ^ 1]))
    with pytest.raises(BlockCorrupt, match="checksum"):
        bdir.open_file("c/1")
    with pytest.raises(BlockCorrupt, match="checksum"):
        bdir.read("c/1")


def test_a_truncated_or_longer_file_is_found_bad(bdir):
    data = blob(10000, 4)
    for name, size in (("t/short", 9999), ("t/long", 10001)):
        bdir.write(name, data, checksum(data))
        os.truncate(bdir.path(name), size)
        with pytest.raises(BlockCorrupt):
            bdir.open_file(name)
        with pytest.raises(BlockCorrupt):
            bdir.read(name)
        with pytest.raises(BlockCorrupt):
            bdir.read_into(name, bytearray(20000))
    problems = {i.name: i.problem for i in bdir.scan()}
    assert problems == {"t/short": "truncated", "t/long": "longer than its header says"}


def test_a_file_found_at_a_restart_is_read_whole_before_it_is_handed_out(tmp_path):
    first = BlockDirectory(tmp_path / "t", beside=True)
    if not first.beside:
        pytest.skip("no user extended attributes here")
    data = blob(100000, 5)
    first.write("s/1", data, checksum(data))
    with open(first.path("s/1"), "r+b") as fh:  # damaged while no daemon ran
        fh.seek(500)
        fh.write(bytes([data[500] ^ 0x80]))
    again = BlockDirectory(tmp_path / "t", beside=True)  # a restart: nothing known checked
    with pytest.raises(BlockCorrupt):
        again.open_file("s/1")
    with pytest.raises(BlockNotFound):
        again.open_file("s/missing")


@pytest.fixture(params=[False, True], ids=["buffered", "direct"])
def short_bdir(request):
    """A block directory at a short path (a path holds at most 4,096 bytes: a name too
    long for an attribute does not fit under pytest's deep temporary directories)."""
    base = Path(tempfile.mkdtemp(prefix="kb", dir="/tmp"))
    try:
        d = BlockDirectory(base / "t", direct_io=request.param, beside=True)
        if not d.beside:
            pytest.skip(f"{base} keeps no user extended attributes")
        yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_names_too_long_for_an_attribute_keep_the_header_first(short_bdir):
    bdir = short_bdir
    name = "l/" + "/".join(["n" * 200] * 20)  # 4022 bytes, in components a filesystem takes
    assert not beside_fits(name)
    data = blob(3000, 6)
    bdir.write(name, data, checksum(data))
    assert Path(bdir.path(name)).read_bytes()[:8] == b"KVFSBLK\x01"
    assert bdir.open_file(name) is None
    with bdir.read(name) as ref:
        assert bytes(ref.data) == data
