"""A client read in one round trip (protocol version 3): ``checkout`` leases a batch and
answers in columns, and ends the previous read's leases (``release``) in the same request;
a request sent without waiting is never waited for before the next one goes out."""

from __future__ import annotations

import logging
import random

import pytest

from kvfs.client import Client
from kvfs.client.connection import Connection
from kvfs.protocol import CheckedOut, Checkout, Hello, Ping, Pong, Release, Statistics, Suspect
from kvfs.runtime import control_socket_path

from support.deadlines import wait_for

KiB = 1 << 10


def _blob(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _leases(mp) -> int:
    with Connection(control_socket_path(mp)) as c:
        return c.request(Statistics()).statistics.leases


def test_checkout_answers_in_columns_and_ends_the_leases_it_names(kvfs_mount):
    mp = kvfs_mount(dram="8MiB", disk="32MiB")
    with Client(mp, write=True) as c:
        c.put(["c/a", "c/b", "c/disk"], [_blob(1, 64 * KiB), _blob(2, 8 * KiB), _blob(3, 16 * KiB)])
        c.evict(["c/disk"], tier="dram")
    with Connection(control_socket_path(mp)) as conn:
        conn.request(Hello(client="raw"))
        r = conn.request(Checkout(names=["c/a", "c/missing", "c/disk", "c/b"], ttl=30, promote="never"))
        assert isinstance(r, CheckedOut) and r.ttl == 30
        assert r.kinds == ["arena", "", "file", "arena"]
        assert r.lengths == [64 * KiB, 0, 16 * KiB, 8 * KiB]
        assert r.tiers == [0, -1, 1, 0]  # positions in the welcome's tier list (dram, disk)
        assert r.paths[0] == r.paths[1] == r.paths[3] == "" and r.paths[2].endswith("/blocks/c/disk")
        assert r.ids[1] == 0 and all(r.ids[i] > 0 for i in (0, 2, 3))
        assert [e is None for e in r.errors] == [True, False, True, True]
        assert r.errors[1].type == "BlockNotFound"
        assert _leases(mp) == 3
        # the next checkout ends them: they leave the session at once (a release of them
        # now finds none), the store ends them once its reply is out; the new ones held
        again = conn.request(Checkout(names=["c/a", "c/disk", "c/b"], release=[i for i in r.ids if i]))
        assert again.errors == [] and len(set(again.ids) & set(r.ids)) == 0
        assert conn.request(Release(ids=[i for i in r.ids if i])).count == 0
        wait_for(lambda: _leases(mp) == 3, timeout=30)
        # ids this session does not hold are not ended (nor are anyone else's)
        with Connection(control_socket_path(mp)) as other:
            other.request(Hello(client="other"))
            other.request(Checkout(names=["c/b"], release=list(again.ids)))
            assert _leases(mp) == 4
        assert _leases(mp) == 3  # the other session ended, and its lease with it


def test_a_reads_leases_end_with_the_next_read_or_soon_after(kvfs_mount):
    mp = kvfs_mount(dram="8MiB", disk="32MiB")
    names = [f"r/{i:02x}" for i in range(8)]
    with Client(mp, write=True) as c:
        c.put(names, [_blob(i, 32 * KiB) for i in range(8)])
        outs = [bytearray(32 * KiB) for _ in names]
        for _ in range(20):  # back to back: each read ends the previous read's leases
            assert c.get_into(names, outs) == [32 * KiB] * 8
            assert _leases(mp) <= 8
        assert [bytes(o) for o in outs] == [_blob(i, 32 * KiB) for i in range(8)]
        wait_for(lambda: _leases(mp) == 0, timeout=30)  # the client went quiet: ended on their own
        c.get_into(names, outs)
        c.stat(names[0])  # any other request carries them first
        assert _leases(mp) == 0


def test_a_failed_request_sent_without_waiting_is_logged_and_the_replies_stay_in_order(kvfs_mount, caplog):
    mp = kvfs_mount(dram="8MiB", disk="32MiB")
    with Connection(control_socket_path(mp)) as conn:
        conn.request(Hello(client="raw"))
        conn.submit(Suspect(lease=12345, why="test"))  # not a lease of ours: LeaseEnded
        conn.submit(Release(ids=[1, 2]))
        with caplog.at_level(logging.WARNING, logger="kvfs.client"):
            assert isinstance(conn.request(Ping()), Pong)
        assert "a suspect request sent without waiting failed" in caplog.text
        assert "lease 12345 is not held by this session" in caplog.text
        assert isinstance(conn.request(Ping()), Pong)


@pytest.mark.parametrize("copy", [False, True])
def test_reads_in_batches_through_a_copy_buffer_free_its_slots(kvfs_mount, copy):
    """A copy-path read split into several checkouts: each ends the previous one's leases
    (and copy-buffer slots) before taking its own, so a buffer smaller than the read works."""
    cfg = '[client]\ncopy_buffer = "256KiB"\n'
    mp = kvfs_mount(f'[[tiers]]\nkind = "dram"\ncapacity = "8MiB"\nprefault = false\nmlock = false\n\n{cfg}')
    names = [f"b/{i:02x}" for i in range(12)]
    with Client(mp, write=True) as w:
        w.put(names, [_blob(10 + i, 64 * KiB) for i in range(12)])
    with Client(mp, copy=copy) as c:
        outs = [bytearray(64 * KiB) for _ in names]
        assert c.get_into(names, outs) == [64 * KiB] * 12
        assert [bytes(o) for o in outs] == [_blob(10 + i, 64 * KiB) for i in range(12)]


def test_a_lost_session_is_not_silently_reconnected(kvfs_mount):
    """Once its connection is gone, a client fails every call at once instead of sending
    it on a new connection that has no session (no hello, none of its leases)."""
    from kvfs.protocol import DaemonNotAnswering

    mp = kvfs_mount(dram="8MiB", disk="32MiB")
    c = Client(mp)
    c.lookup(["x"])
    c._conn.close()  # as after a reply that never came
    with pytest.raises(DaemonNotAnswering, match="the connection was lost earlier; open a new session"):
        c.lookup(["x"])
    c.close()
    with Client(mp) as fresh:
        assert fresh.lookup(["x"]).prefix == 0
