"""The typed protocol on its own: every message survives the wire, every error class
crosses as itself, and every bad frame is refused saying what is wrong."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing

import pytest

from kvfs import errors as core
from kvfs.catalog import BlockStat
from kvfs.protocol import (
    ERRORS,
    MAX_FRAME,
    VERSION,
    Error,
    Grant,
    Leased,
    LineBuffer,
    Lookup,
    ProtocolError,
    RemoteError,
    Stat,
    StatResult,
    UnknownKind,
    VersionMismatch,
    WireError,
    decode,
    encode,
    error_type,
    rebuild,
)
from kvfs.protocol.codec import kinds


def sample(tp, depth=0):
    """A value of type *tp* (the first option of a union, a one-item list)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is int:
        return 7
    if tp is float:
        return 1.5
    if tp is str:
        return "ns/ab/x"
    if tp is bool:
        return True
    if tp is typing.Any:
        return {"any": [1, "x"]}
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)), depth)
    if origin is list:
        return [sample(args[0], depth + 1)]
    if origin is tuple:
        return (sample(args[0], depth + 1),)
    if origin is dict:
        return {"k": sample(args[1], depth + 1)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp))
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: sample(hints[f.name], depth + 1) for f in dataclasses.fields(tp) if f.init})
    raise AssertionError(f"no sample for {tp}")


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_every_message_survives_the_wire(kind):
    cls = kinds()[kind]
    msg = sample(cls)
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    body = json.loads(line)
    assert body["v"] == VERSION and body["kind"] == kind
    assert decode(line) == msg
    assert decode(line.rstrip(b"\n")) == msg  # with or without its newline


def test_optional_fields_and_defaults():
    assert decode(b'{"v": 3, "kind": "ls"}').name == ""  # a field with a default may be left out
    leased = Leased(grants=[None], errors=[WireError(type="BlockNotFound", message="x")])
    assert decode(encode(leased)) == leased


@pytest.mark.parametrize(
    ("frame", "error", "message"),
    [
        (b"", ProtocolError, "a frame is not JSON; each message is one JSON object per line"),
        (b'"x"', ProtocolError, "a frame is a JSON object, not str"),
        (b'{"kind": "ping"}', VersionMismatch, "protocol version None is not spoken here"),
        (b'{"v": 1, "kind": "ping"}', VersionMismatch, "protocol version 1 is not spoken here"),
        (b'{"v": 3}', UnknownKind, "unknown message kind None"),
        (b'{"v": 3, "kind": "format_disk"}', UnknownKind, "unknown message kind 'format_disk'"),
        (b'{"v": 3, "kind": "stat"}', ProtocolError, "stat: missing field 'name'"),
        (b'{"v": 3, "kind": "stat", "name": null}', ProtocolError, "stat.name: expected a string, got null"),
        (b'{"v": 3, "kind": "pin", "paths": "a"}', ProtocolError, "pin.paths: expected a list, got str"),
        (b'{"v": 3, "kind": "pin", "paths": ["a", 1]}', ProtocolError, "pin.paths[1]: expected a string, got int"),
        (b'{"v": 3, "kind": "pin", "paths": [], "pinned": 1}', ProtocolError, "pin.pinned: expected true or false"),
        (b'{"v": 3, "kind": "lookup", "names": [true]}', ProtocolError, "lookup.names[0]: expected a string, got bool"),
        (b'{"v": 3, "kind": "release", "ids": [1.5]}', ProtocolError, "release.ids[0]: expected an integer, got float"),
        (
            b'{"v": 3, "kind": "leased", "grants": [{"id": 1}], "errors": [null]}',
            ProtocolError,
            "leased.grants[0]: missing field 'tier'",
        ),
        (
            b'{"v": 3, "kind": "event", "event": {"seq": 1, "time": 0, "kind": "exploded", "name": "a"}}',
            ProtocolError,
            "event.event.kind: 'exploded' is not one of 'stored'",
        ),
    ],
)
def test_bad_frames_say_what_is_wrong(frame, error, message):
    with pytest.raises(error) as info:
        decode(frame)
    assert type(info.value) is error
    assert str(info.value).startswith(message)


def test_a_frame_over_the_limit_is_refused():
    with pytest.raises(ProtocolError, match="longer than the limit"):
        decode(b" " * (MAX_FRAME + 1))
    buf = LineBuffer()
    buf.feed(b"x" * MAX_FRAME)
    with pytest.raises(ProtocolError, match="split the batch"):
        buf.feed(b"xx")


def test_line_buffer_reassembles_frames_however_they_are_cut():
    frames = [encode(Stat(name=f"n/{i}")) for i in range(5)] + [encode(Lookup(names=["a" * 5000]))]
    stream = b"".join(frames)
    for cut in (1, 7, 64, 4096, len(stream)):
        buf = LineBuffer()
        got = []
        for i in range(0, len(stream), cut):
            got += buf.feed(stream[i : i + cut])
        assert [decode(g) for g in got] == [decode(f) for f in frames] and buf.pending == 0


def test_nested_core_dataclasses_keep_their_types():
    st = BlockStat(
        name="a/b",
        size=3,
        checksum=2**63 + 5,
        tiers=("dram", "disk"),
        pinned=False,
        hits=2,
        created=1.0,
        accessed=2.5,
        parent=None,
    )
    back = decode(encode(StatResult(block=st)))
    assert back.block == st and isinstance(back.block.tiers, tuple)
    assert back.to_json() == st.to_json()  # what --json prints is the block's own form


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_crosses_as_itself(cls):
    exc = cls.__new__(cls)
    core.KvfsError.__init__(exc, "what went wrong")
    back = Error.of(exc).exception()
    assert type(back) is cls and str(back) == "what went wrong"
    assert decode(encode(Error.of(exc))).exception().__class__ is cls


def test_errors_the_table_does_not_list():
    class Odd(core.BlockNotFound):
        pass

    assert error_type(Odd("x")) == "BlockNotFound"  # sent as its nearest listed base
    assert error_type(ValueError("x")) == "KvfsError"
    remote = rebuild("ErrorFromTheFuture", "a newer daemon said no")
    assert isinstance(remote, RemoteError) and remote.type == "ErrorFromTheFuture"
    assert str(remote) == "a newer daemon said no" and error_type(remote) == "ErrorFromTheFuture"
    busy = rebuild("StoreBusy", "busy")
    assert isinstance(busy, core.StoreBusy) and busy.tier is None
    cfg = rebuild("ConfigError", "config error in x: y")
    assert isinstance(cfg, core.ConfigError) and str(cfg) == "config error in x: y"


def test_unsigned_64_bit_checksums_cross_exactly():
    g = Grant(id=1, tier="disk", kind="file", path="/p", offset=4096, length=10, checksum=2**64 - 1, ttl=30.0)
    assert decode(encode(Leased(grants=[g], errors=[None]))).grants[0].checksum == 2**64 - 1
