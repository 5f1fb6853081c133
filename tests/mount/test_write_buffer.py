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
    assert snap == first + second
    small = WriteBuffer()
    small.write(0, b"abc")
    small.write(3, b"def")
    frozen = small.snapshot()
    small.write(0, b"X")
    assert frozen == b"abcdef" and small.snapshot() == b"Xbcdef"


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
    assert buf.allocated == 0 and buf.snapshot() == base
    buf.write(CHUNK + 5, b"xy")
    assert buf.allocated == CHUNK  # only the chunk written was copied
    expect = bytearray(base)
    expect[CHUNK + 5 : CHUNK + 7] = b"xy"
    assert buf.snapshot() == bytes(expect)
    buf.truncate(10)
    buf.truncate(20)
    assert buf.snapshot() == base[:10] + bytes(10)
