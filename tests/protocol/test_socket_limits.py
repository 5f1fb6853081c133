"""The daemon's socket at its edges: every field validated at decode, caps per request,
batches that leave nothing held, big batches off the loop (issue 20, items 7, 8, 13).

The server is the daemon's own (``kvfs.mount.control.Server`` over a real store and a real
Unix socket, tests/support/control_harness.py); frames are sent raw, as a careless or hostile
client would."""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path

import pytest

from kvfs.client import Client
from kvfs.protocol import VERSION

from support.control_harness import ControlServer, make_store

_V = b'{"v":%d,' % VERSION  # a raw frame's start, in this release's protocol version

MAX_ITEMS = 65536  # kvfs.protocol.MAX_ITEMS: the most names or ids one request carries

MiB = 1 << 20


class Raw:
    """A raw connection to a daemon socket: frames out, one JSON reply per frame in."""

    def __init__(self, path: Path, timeout: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")

    def ask(self, frame: bytes | dict) -> dict:
        if isinstance(frame, dict):
            frame = json.dumps({"v": VERSION, **frame}).encode()
        self.sock.sendall(frame + b"\n")
        line = self.file.readline()
        assert line, "the daemon hung up"
        return json.loads(line)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture
def server(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kvfs")
    store = make_store(tmp_path, dram=16 * MiB, disk=64 * MiB)
    with ControlServer(store) as srv:
        yield srv
    store.close()
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, [r.getMessage() for r in tracebacks]  # a bad frame is never a bug of the daemon


def _error(reply: dict) -> tuple[str, str]:
    assert reply["kind"] == "error", reply
    return reply["type"], reply["message"]


# -- item 13: every field validated at decode ----------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "-Infinity", "Infinity", "1e999", "-1", "-0.5"])
@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        ("lease", '"names": ["a/b"], "ttl": ', "lease.ttl"),
        ("renew", '"ids": [1], "ttl": ', "renew.ttl"),
        ("pin", '"paths": ["a/b"], "ttl": ', "pin.ttl"),
    ],
)
def test_a_bad_ttl_is_a_clear_error_naming_the_field(server, kind, body, field, value):
    c = Raw(server.socket)
    frame = f'{{"v": {VERSION}, "kind": "{kind}", {body}{value}}}'.encode()
    typ, msg = _error(c.ask(frame))
    assert typ == "ProtocolError" and msg.startswith(f"{field}: "), msg
    assert c.ask({"kind": "ping"})["kind"] == "pong"  # the connection serves on
    c.close()


@pytest.mark.parametrize("value", ["0", "0.0", "-0.0"])
def test_a_soft_pin_of_no_time_is_a_clear_error(server, value):
    """``kvfs bench fuzz`` found a pin with ttl 0 answered InternalError (the store's
    ValueError): a soft pin must last some time, and the refusal names the field."""
    c = Raw(server.socket)
    typ, msg = _error(c.ask(f'{{"v": {VERSION}, "kind": "pin", "paths": ["a/b"], "ttl": {value}}}'.encode()))
    assert typ == "ProtocolError" and msg.startswith("pin.ttl: ") and "not more than 0" in msg, msg
    assert c.ask({"kind": "ping"})["kind"] == "pong"
    c.close()


def test_deep_nesting_wide_integers_and_huge_batches_are_refused_by_name(server):
    c = Raw(server.socket)
    typ, msg = _error(c.ask(b"[" * 200_000 + b"]" * 200_000))
    assert typ == "ProtocolError" and "nests deeper" in msg
    typ, msg = _error(c.ask(_V + b' "kind": "lookup", "names": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"))
    assert typ == "ProtocolError" and "nests deeper" in msg
    typ, msg = _error(c.ask({"kind": "release", "ids": [2**70]}))
    assert (typ, msg) == ("ProtocolError", "release.ids[0]: expected an integer, got an integer wider than 64 bits")
    typ, msg = _error(c.ask({"kind": "commit", "ids": [1], "checksums": [-1]}))
    assert msg == "commit.checksums[0]: -1 is less than 0 (an xxh3-64 checksum)"
    typ, msg = _error(c.ask({"kind": "quota_set", "name": "t", "quotas": {"dram": -5}}))
    assert msg == "quota_set.quotas.dram: -5 is less than 0 (bytes)"
    typ, msg = _error(c.ask({"kind": "hello", "client": "x" * 5000}))
    assert msg == "hello.client: 5000 characters, at most 4096"
    for kind, field in (("renew", "ids"), ("release", "ids"), ("abort", "ids"), ("lookup", "names")):
        items = list(range(MAX_ITEMS + 1)) if field == "ids" else [f"n/{i}" for i in range(MAX_ITEMS + 1)]
        typ, msg = _error(c.ask({"kind": kind, field: items}))
        assert (typ, msg) == (
            "ProtocolError",
            f"{kind}.{field}: {MAX_ITEMS + 1} items in one request, at most {MAX_ITEMS}; split the batch",
        )
    # millions of values are refused before they are parsed (parsing holds the interpreter)
    typ, msg = _error(c.ask(_V + b' "kind": "renew", "ids": [' + b"1," * 2_000_000 + b"1]}"))
    assert typ == "ProtocolError" and "2000003 values" in msg and "split the batch" in msg
    assert c.ask({"kind": "ping"})["kind"] == "pong"
    c.close()


# -- item 8: batches leave nothing held --------------------------------------------------


def test_commit_and_abort_handle_each_id_alone_and_leave_nothing_reserved(server):
    store = server.store
    c = Raw(server.socket)
    assert c.ask({"kind": "hello", "write": True})["kind"] == "welcome"

    def reserve(*names: str) -> list[int]:
        r = c.ask({"kind": "reserve", "names": list(names), "sizes": [4 * MiB] * len(names)})
        assert r["kind"] == "reserved", r
        return [s["id"] for s in r["slots"]]

    a, b = reserve("t/a", "t/b")
    [ok, unknown] = c.ask({"kind": "commit", "ids": [a, 999_999], "checksums": [0, 0]})["errors"]
    assert ok["type"] == "BlockCorrupt"  # handled: checked (and, wrong, given back)
    assert unknown["type"] == "LeaseEnded" and "reservation 999999 is not held" in unknown["message"]
    [first, twice] = c.ask({"kind": "commit", "ids": [b, b], "checksums": [0, 0]})["errors"]
    assert first["type"] == "BlockCorrupt" and twice == {
        "type": "ProtocolError",
        "message": f"commit: reservation {b} is named twice; the first is committed",
    }
    assert len(store.ingest) == 0
    [d] = reserve("t/d")
    assert c.ask({"kind": "abort", "ids": [d, 424_242]}) == {"v": VERSION, "kind": "aborted", "count": 1}
    [e] = reserve("t/e")
    assert c.ask({"kind": "abort", "ids": [e, e]})["count"] == 1
    assert len(store.ingest) == 0 and store.statistics().reserved == 0
    reserve("t/f", "t/g")  # held by a session that then ends
    c.close()
    deadline = threading.Event()
    for _ in range(500):
        if len(store.ingest) == 0:
            break
        deadline.wait(0.02)
    assert len(store.ingest) == 0
    # the whole arena is free again: a put of everything a client may put goes in
    with Client(server.socket, write=True) as w:
        w.put(["t/big"], [bytes(w.welcome.max_put)])
        assert w.lookup(["t/big"]).sizes == [w.welcome.max_put]


# -- item 7: one reader slows only itself ----------------------------------------------------


def test_a_big_renew_runs_off_the_loop_and_others_are_served_meanwhile(server):
    store = server.store
    with Client(server.socket, write=True) as w:
        w.put(["r/x"], [b"x" * 4096])
    gate = threading.Event()
    inside = threading.Event()
    renew = store.leases.renew

    def held_renew(lease_id, ttl):  # the first renew of the batch waits until the ping was answered
        inside.set()
        gate.wait(120)
        return renew(lease_id, ttl)

    store.leases.renew = held_renew
    big = Raw(server.socket)
    other = Raw(server.socket, timeout=120)
    try:
        assert big.ask({"kind": "hello"})["kind"] == "welcome"
        [grant] = big.ask({"kind": "lease", "names": ["r/x"]})["grants"]
        big.sock.sendall(json.dumps({"v": VERSION, "kind": "renew", "ids": [grant["id"]] * MAX_ITEMS}).encode() + b"\n")
        assert inside.wait(120)
        assert other.ask({"kind": "ping"})["kind"] == "pong"  # answered while the big renew is held
        assert other.ask({"kind": "lookup", "names": ["r/x"]})["sizes"] == [4096]
    finally:
        gate.set()
    ttls = json.loads(big.file.readline())["ttls"]
    assert len(ttls) == MAX_ITEMS and all(t is not None and t > 0 for t in ttls)
    store.leases.renew = renew
    big.close()
    other.close()


def test_the_client_splits_batches_past_the_cap(server):
    names = [f"s/{i}" for i in range(MAX_ITEMS + 10)]
    with Client(server.socket, write=True) as c:
        c.put(names[:3] + names[-2:], [b"y"] * 5)
        found = c.lookup(names)
        assert len(found) == len(names) and found.prefix == 3
        assert [i for i in range(len(names)) if found.present(i)] == [0, 1, 2, len(names) - 2, len(names) - 1]
        assert c.lookup(names[:3]).prefix == 3
