"""The client's read copy and its finished leases (issue 21, the client at memcpy speed).

- ``buffers.copy`` picks a vector loop where glibc's string copy stalls (the destination a
  little above the source modulo a page) and a plain copy elsewhere: the bytes are the
  same in every case, whatever the two addresses, lengths and alignments.
- ``DeferredReleases`` is not woken per read while reads keep coming, and still sends
  every id: within its delay while the client is active, and after it fell asleep (an add
  wakes it).
- A client read through the arena into buffers at every such relative address is
  byte-exact (the arena's blocks are page-aligned; numpy's buffers are 16 bytes past a
  page, the stalling case).
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from kvfs.client import Client, buffers
from kvfs.client.releases import DeferredReleases

from support.deadlines import wait_for

KiB = 1 << 10
PAGE = 4096


def _aligned(n: int, at: int) -> np.ndarray:
    """*n* bytes starting *at* bytes past a page boundary."""
    raw = np.empty(n + 2 * PAGE, np.uint8)
    start = (-raw.ctypes.data) % PAGE + at
    return raw[start : start + n]


@pytest.mark.parametrize("src_at", [0, 8, 100])
@pytest.mark.parametrize("dst_at", [0, 8, 16, 24, 64, 255, 256, 4080])
@pytest.mark.parametrize("n", [64 * KiB, 256 * KiB + 8, 256 * KiB + 3])
def test_copy_is_exact_at_every_relative_address(src_at, dst_at, n):
    rng = np.random.default_rng(n + src_at + dst_at)
    src = _aligned(n, src_at)
    src[:] = rng.integers(0, 256, n, dtype=np.uint8)
    dst = _aligned(n, dst_at)
    dst.fill(0)
    buffers.copy(memoryview(dst), memoryview(src).toreadonly())
    assert np.array_equal(dst, src)
    dst.fill(0)  # the caller's address of the source, as the client passes the arena's
    buffers.copy(memoryview(dst), memoryview(src), buffers.address(memoryview(src)))
    assert np.array_equal(dst, src)


def test_scatter_fills_segments_in_order_with_the_source_address():
    n = 300 * KiB
    src = _aligned(n, 0)
    src[:] = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    segs = [_aligned(64, 16), _aligned(200 * KiB, 16), _aligned(n, 8)]
    buffers.scatter(memoryview(src), [memoryview(s) for s in segs], buffers.address(memoryview(src)))
    got = np.concatenate(segs)[:n]
    assert np.array_equal(got, src)


def test_address_of_a_read_only_and_a_writable_view_agree():
    a = _aligned(64 * KiB, 16)
    assert buffers.address(memoryview(a)) == buffers.address(memoryview(a).toreadonly()) == a.ctypes.data


class _Sent:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, ids: list[int]) -> None:
        with self.lock:
            self.ids += ids


def test_deferred_releases_send_every_id_active_or_after_falling_asleep():
    sent = _Sent()
    d = DeferredReleases(sent, delay=0.01, linger=0.05)
    try:
        d.add([1, 2])
        wait_for(lambda: sent.ids == [1, 2], timeout=30)
        # idle past linger: the thread sleeps until an add wakes it
        wait_for(lambda: d._sleeping, timeout=30)
        d.add([3])
        wait_for(lambda: sent.ids == [1, 2, 3], timeout=30)
        # ids taken by a request are not sent again
        d.add([4])
        assert d.take() in ([4], [])
        d.add([5])
        wait_for(lambda: 5 in sent.ids, timeout=30)
        assert len(sent.ids) == len(set(sent.ids))  # none sent twice
    finally:
        d.close()
    d.add([6])  # after close: dropped (the session's end ended them)
    assert 6 not in sent.ids


def test_deferred_releases_are_not_woken_per_add_while_active():
    sent = _Sent()
    d = DeferredReleases(sent, delay=60.0, linger=600.0)
    try:
        d.add([1])
        wait_for(lambda: d._thread is not None and not d._sleeping, timeout=30)
        notified = []
        real = d._cond.notify
        d._cond.notify = lambda *a: (notified.append(1), real(*a))  # type: ignore[method-assign]
        for i in range(2, 50):
            d.add([i])
            d.take()
        assert notified == []  # the thread looks on its own clock while reads keep coming
        assert sent.ids == []  # and sent nothing a request took
    finally:
        d.close()


@pytest.mark.parametrize("at", [0, 8, 16, 64])
def test_a_read_into_buffers_at_any_page_offset_is_byte_exact(kvfs_mount, at):
    mp = kvfs_mount(dram="32MiB", disk="64MiB")
    n = 256 * KiB
    rng = np.random.default_rng(at)
    blocks = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(6)]
    names = [f"cp/{at}/{i}" for i in range(6)]
    with Client(mp, write=True) as c:
        c.put(names, blocks)
        outs = [_aligned(n, at) for _ in names]
        for _ in range(3):
            for o in outs:
                o.fill(0)
            assert c.get_into(names, outs, verify=True) == [n] * 6
            assert all(np.array_equal(o, b) for o, b in zip(outs, blocks))
        split = [[_aligned(64, at), _aligned(n - 64, at)] for _ in names]  # a block over two buffers
        c.get_into(names, split)
        assert all(np.array_equal(np.concatenate(s), b) for s, b in zip(split, blocks))


def test_a_checkout_reply_with_short_columns_is_a_protocol_error(kvfs_mount):
    """A reply whose columns do not all hold one entry per name (a daemon bug, or a frame
    damaged on the way) fails the read, never pairs a name with another's lease."""
    from kvfs.protocol import ProtocolError

    mp = kvfs_mount(dram="8MiB", disk="32MiB")
    with Client(mp, write=True) as c:
        c.put(["sc/a", "sc/b"], [b"a" * 4096, b"b" * 4096])
        real = c._conn.request

        def short(req, reply=None):
            r = real(req, reply)
            if type(r).__name__ == "CheckedOut":
                c._done.add([i for i in r.ids if i])  # ended with the next request
                r = dataclasses.replace(r, offsets=r.offsets[:1])
            return r

        c._conn.request = short  # type: ignore[method-assign]
        with pytest.raises(ProtocolError, match="columns of other lengths"):
            c.get_into(["sc/a", "sc/b"], [bytearray(4096), bytearray(4096)])
        c._conn.request = real  # type: ignore[method-assign]
        outs = [bytearray(4096), bytearray(4096)]
        assert c.get_into(["sc/a", "sc/b"], outs) == [4096, 4096]
        assert outs == [bytearray(b"a" * 4096), bytearray(b"b" * 4096)]


def test_the_clients_lease_tuple_has_the_grants_fields_in_order():
    """A read's leases are plain tuples built from the checkout reply's columns, in the
    protocol's Grant field order (a NamedTuple, for speed): a field added to or moved in
    Grant must be mirrored there, or every read would unpack the wrong column."""
    from kvfs.client.client import _Leased
    from kvfs.protocol import Grant

    assert _Leased._fields == tuple(f.name for f in dataclasses.fields(Grant))
