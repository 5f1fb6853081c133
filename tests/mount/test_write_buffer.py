"""The mount's sparse write buffer against a plain bytearray model (random operations)."""

from __future__ import annotations

import random

import pytest

from kvfs.mount.buffer import CHUNK, WriteBuffer


class Model:
    def __init__(self, base: bytes = b"") -> None:
        self.b = bytearray(base)

    def write(self, off: int, data: bytes) -> None:
        if off > len(self.b):
            self.b.extend(bytes(off - len(self.b)))
        self.b[off : off + len(data)] = data

    def truncate(self, n: int) -> None:
        if n < len(self.b):
            del self.b[n:]
        else:
            self.b.extend(bytes(n - len(self.b)))


def check(buf: WriteBuffer, model: Model, rng: random.Random) -> None:
    assert buf.size == len(model.b)
    assert bytes(buf.snapshot()) == bytes(model.b)
    for _ in range(3):
        off = rng.randrange(0, len(model.b) + 10)
        n = rng.randrange(0, 3 * CHUNK)
        assert buf.read(off, n) == bytes(model.b[off : off + n])
    assert buf.allocated <= len(model.b) + CHUNK  # never more than the file and one chunk of slack
    assert buf.allocated == sum(len(c) for c in buf._chunks.values())


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("with_base", [False, True])
def test_random_operations_match_a_bytearray(seed, with_base):
    rng = random.Random(seed)
    base = rng.randbytes(rng.randrange(1, 3 * CHUNK)) if with_base else b""
    buf = WriteBuffer(memoryview(base) if with_base else None)
    model = Model(base)
    for _ in range(40):
        op = rng.random()
        if op < 0.6:
            size = rng.choice([1, 100, 4096, CHUNK - 1, CHUNK, CHUNK + 7])
            off = rng.choice([0, CHUNK, 2 * CHUNK, rng.randrange(0, 4 * CHUNK), buf.size])
            data = rng.randbytes(size)
            bound = buf.allocated + WriteBuffer.growth_bound(size)
            buf.write(off, data)
            model.write(off, data)
            assert buf.allocated <= bound
        elif op < 0.85:
            n = rng.randrange(0, 4 * CHUNK)
            buf.truncate(n)
            model.truncate(n)
        check(buf, model, rng)


def test_whole_chunks_are_kept_without_a_copy_and_a_snapshot_is_frozen():
    buf = WriteBuffer()
    first, second = bytes([1]) * CHUNK, bytes([2]) * CHUNK
    buf.write(0, first)
    assert buf._chunks[0] is first
    buf.write(CHUNK, second)
    snap = buf.snapshot()
    buf.write(10, b"changed")
    assert bytes(snap) == first + second
    small = WriteBuffer()
    small.write(0, b"abc")
    small.write(3, b"def")
    frozen = small.snapshot()
    small.write(0, b"X")
    assert bytes(frozen) == b"abcdef" and bytes(small.snapshot()) == b"Xbcdef"


def test_a_huge_hole_costs_nothing():
    buf = WriteBuffer()
    buf.truncate(1 << 40)
    assert buf.allocated == 0 and buf.size == 1 << 40
    buf.write((1 << 40) - 3, b"end")
    assert buf.allocated <= CHUNK
    assert buf.read((1 << 40) - 5, 10) == b"\0\0end"
    assert buf.read(12345, 4) == bytes(4)


def test_base_is_copied_on_write_only_where_written():
    base = bytes(range(256)) * (3 * CHUNK // 256)
    buf = WriteBuffer(memoryview(base))
    assert buf.allocated == 0 and bytes(buf.snapshot()) == base
    buf.write(CHUNK + 5, b"xy")
    assert buf.allocated == CHUNK  # only the chunk written was copied
    expect = bytearray(base)
    expect[CHUNK + 5 : CHUNK + 7] = b"xy"
    assert bytes(buf.snapshot()) == bytes(expect)
    buf.truncate(10)
    buf.truncate(20)
    assert bytes(buf.snapshot()) == base[:10] + bytes(10)


def test_a_snapshot_is_the_chunks_not_joined():
    """The seal's bytes are the buffer's own chunks, the base's views and shared zeros
    (kvfs.pieces): no copy of the file, and a final snapshot copies nothing at all."""
    base = bytes(range(256)) * (3 * CHUNK // 256 + 1)  # a base block, not a multiple of a chunk
    buf = WriteBuffer(memoryview(base))
    whole = bytes([7]) * CHUNK
    buf.write(CHUNK, whole)  # chunk 1 replaced whole: kept as it came
    buf.write(2 * CHUNK + 3, b"xyz")  # chunk 2 copied out of the base, patched (a bytearray)
    buf.truncate(4 * CHUNK + 10)  # a hole past the base's end, then a short last chunk
    buf.write(4 * CHUNK + 5, b"tail!")
    expect = bytearray(base) + bytes(4 * CHUNK + 10 - len(base))
    expect[CHUNK : 2 * CHUNK] = whole
    expect[2 * CHUNK + 3 : 2 * CHUNK + 6] = b"xyz"
    expect[4 * CHUNK + 5 : 4 * CHUNK + 10] = b"tail!"
    final = buf.snapshot(final=True)
    assert bytes(final) == bytes(expect) and len(final) == len(expect)
    assert final.views[1].obj is whole  # the chunk itself, not a copy
    assert final.views[2].obj is buf._chunks[2]  # a final seal copies no chunk
    assert final.views[0].obj is base  # the base read through, not copied
    frozen = buf.snapshot()
    assert frozen.views[2].obj is not buf._chunks[2]  # a chunk later writes change is copied
    buf.write(2 * CHUNK, bytes([9]) * (CHUNK + 1))  # grows and rewrites that chunk in place
    assert bytes(frozen) == bytes(expect)


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 4097])
def test_snapshot_pieces_at_the_edges_of_a_chunk(size):
    rng = random.Random(size)
    data = rng.randbytes(size)
    for step in (CHUNK, 4096 + 3):  # whole chunks (kept), and writes not aligned to anything
        buf = WriteBuffer()
        for off in range(0, size, step):
            buf.write(off, data[off : off + step])
        for final in (False, True):
            snap = buf.snapshot(final=final)
            assert len(snap) == size and bytes(snap) == data
            assert all(len(v) for v in snap.views)  # no empty piece
