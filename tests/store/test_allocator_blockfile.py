"""The arena allocator's bookkeeping and the block file format."""

import itertools
import random

import pytest

from kvfs.allocator import ExtentAllocator
from kvfs.blockfile import ALIGN, checksum, decode_header, encode_header, file_length
from kvfs.errors import BlockCorrupt


def test_allocator_best_fit_and_coalescing():
    a = ExtentAllocator(10 * 4096)
    offs = [a.alloc(4096) for _ in range(10)]
    assert offs == [i * 4096 for i in range(10)]
    assert a.alloc(1) is None
    a.free(4096, 4096)
    a.free(3 * 4096, 10)
    a.free(2 * 4096, 4096)  # coalesces 1..3 into one 3-page hole
    assert a.holes == 1 and a.largest_free == 3 * 4096
    assert a.alloc(2 * 4096) == 4096
    assert a.alloc(4096) == 3 * 4096
    assert a.free_bytes == 0


def test_allocator_random_never_overlaps():
    a = ExtentAllocator(1 << 20)
    rng = random.Random(1)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.5:
            off = rng.choice(list(live))
            a.free(off, live.pop(off))
        else:
            n = rng.randrange(1, 40000)
            off = a.alloc(n)
            if off is not None:
                live[off] = n
        spans = sorted((o, o + a.round(n)) for o, n in live.items())
        assert all(e <= s for (_, e), (s, _) in itertools.pairwise(spans))
        assert a.allocated == sum(a.round(n) for n in live.values())
    for off, n in live.items():
        a.free(off, n)
    assert a.holes == 1 and a.free_bytes == a.size


def test_header_roundtrip_and_alignment():
    h = encode_header("ns/ab/cd", 12345, checksum(b"x"))
    assert len(h) == ALIGN
    hdr = decode_header(h)
    assert (hdr.name, hdr.length, hdr.checksum, hdr.header_length) == ("ns/ab/cd", 12345, checksum(b"x"), ALIGN)
    long = "n/" + "x" * 5000
    assert len(encode_header(long, 1, 0)) == 2 * ALIGN
    assert file_length("a", 1) == 2 * ALIGN and file_length("a", 0) == ALIGN


@pytest.mark.parametrize("offset", [0, 9, 13, 20, 30, 40])
def test_header_flip_is_detected(offset):
    h = bytearray(encode_header("ns/ab/cd", 12345, 99))
    h[offset] ^= 0x10
    with pytest.raises(BlockCorrupt):
        decode_header(h)


@pytest.mark.parametrize("sizes", [[], [0], [7], [1 << 20, 1 << 20], [1, 2, 3, 4093, 65543], [0, 31, 0, 33]])
def test_checksum_of_pieces_is_the_checksum_of_the_joined_bytes(sizes):
    """The block format's checksum does not depend on how a block's bytes were split."""
    from kvfs.pieces import Pieces

    rng = random.Random(len(sizes))
    parts = [rng.randbytes(n) for n in sizes]
    assert checksum(Pieces(parts)) == checksum(b"".join(parts))
    assert checksum(Pieces.of(b"".join(parts))) == checksum(b"".join(parts))
