"""Messages as typed dataclasses, and their encoding: one JSON object per line.

A message is a frozen, keyword-only dataclass deriving from :class:`Message` with a
``kind`` class attribute. On the wire it is ``{"v": VERSION, "kind": KIND, FIELD: VALUE,
...}`` followed by ``\\n``; nested dataclasses are objects, enums their values, tuples
lists. :func:`decode` turns a line back into the message, checking every field against its
annotation, so a bad frame is a :class:`ProtocolError` naming the field, never a
half-built object. Converters are compiled once per class from its type hints.

Only descriptors cross the socket (names, extents, lease ids, checksums); block bytes
never do, so JSON costs little and frames stay readable (``socat - UNIX:...``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, Union

from kvfs.errors import KvfsError

__all__ = [
    "MAX_FRAME",
    "MAX_ITEMS",
    "MAX_VALUES",
    "VERSION",
    "Bounds",
    "LineBuffer",
    "Message",
    "ProtocolError",
    "UnknownKind",
    "VersionMismatch",
    "decode",
    "dump",
    "encode",
    "kinds",
]

VERSION = 3
"""The protocol version. A frame of another version is refused with
:class:`VersionMismatch`; bump it for any change to a message's fields or meaning."""

MAX_FRAME = 32 << 20
"""The largest frame either side accepts (bytes): a lookup of the most names a request may
carry (:data:`MAX_ITEMS`), each up to ~500 bytes long."""

MAX_ITEMS = 65536
"""The most names or ids one request may carry (a batch, not a scan): longer lists are
refused at decode with a :class:`ProtocolError` naming the field and the limit. One
request's work stays short, so one client cannot stall the others (docs/client.md)."""

MAX_VALUES = 4 * MAX_ITEMS
"""The most values a request's frame may hold, counted before it is parsed (its commas,
those inside names included): parsing holds the interpreter, so a frame of millions of
values is refused before it can stall the daemon's other clients."""

MAX_STRING = 4096
"""The longest free-text string field of a request (a client's name, a reason)."""

_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what an integer field may hold: 64 bits, signed or not

T = TypeVar("T")


class ProtocolError(KvfsError):
    """Raised for a frame that is not a valid message: not JSON, not an object, too long,
    or a field missing or of the wrong type (the message names the field)."""


class UnknownKind(ProtocolError):
    """Raised for a frame whose ``kind`` names no message this side knows (an op the
    daemon does not have)."""


class VersionMismatch(ProtocolError):
    """Raised when the other side speaks another protocol version."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Bounds:
    """What a field's decoded value must keep besides its type, checked at decode (a
    frame that breaks it is a :class:`ProtocolError` naming the field): ``min``/``max``
    for a number or each number of a list (``above``: a bound it must exceed); ``items``: a list's or a mapping's most
    entries; ``length``: a string's (or each string's of a list) most characters. Put on
    a message's field with ``field(metadata=Bounds(...).meta())``."""

    min: float | None = None
    max: float | None = None
    above: float | None = None
    items: int | None = None
    length: int | None = None
    why: str = ""
    """What the bound means to a caller, added to the refusal."""

    def meta(self) -> dict[str, Bounds]:
        return {"bounds": self}

    def check(self, v: Any, where: str) -> None:
        """Raise :class:`ProtocolError` unless *v* (already of the field's type) keeps the bounds."""
        hint = f" ({self.why})" if self.why else ""
        if isinstance(v, (list, tuple, dict)):
            if self.items is not None and len(v) > self.items:
                raise ProtocolError(
                    f"{where}: {len(v)} items in one request, at most {self.items}{hint}; split the batch"
                )
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for i, x in items:
                if x is not None and not isinstance(x, (list, tuple, dict)):
                    self._one(x, f"{where}.{i}" if isinstance(v, dict) else f"{where}[{i}]", hint)
            return
        if v is not None:
            self._one(v, where, hint)

    def _one(self, x: Any, where: str, hint: str) -> None:
        if isinstance(x, str):
            if self.length is not None and len(x) > self.length:
                raise ProtocolError(f"{where}: {len(x)} characters, at most {self.length}{hint}")
            return
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return
        if self.min is not None and x < self.min:
            raise ProtocolError(f"{where}: {x!r} is less than {_num(self.min)}{hint}")
        if self.above is not None and not x > self.above:
            raise ProtocolError(f"{where}: {x!r} is not more than {_num(self.above)}{hint}")
        if self.max is not None and x > self.max:
            raise ProtocolError(f"{where}: {x!r} is more than {_num(self.max)}{hint}")

    def fast(self, v: Any) -> bool:
        """The same check without messages, at C speed for lists of numbers or strings."""
        if isinstance(v, (list, tuple, dict)):
            if self.items is not None and len(v) > self.items:
                return False
            if not v or (self.min is None and self.max is None and self.above is None and self.length is None):
                return True
            values = list(v.values()) if isinstance(v, dict) else v
            try:
                return self._fast_values(values)
            except TypeError:  # mixed types (None among numbers): the careful check decides
                return False
        if v is None:
            return True
        return self._fast_values([v])

    def _fast_values(self, values: Any) -> bool:
        if self.length is not None and max(map(len, values)) > self.length:
            return False
        if self.min is not None and min(values) < self.min:
            return False
        if self.above is not None and not min(values) > self.above:
            return False
        return not (self.max is not None and max(values) > self.max)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_KINDS: dict[str, type[Message]] = {}


class Message:
    """Base of every message. Subclasses are ``@dataclass(frozen=True, kw_only=True,
    slots=True)`` with a ``kind: ClassVar[str]``; defining one registers it."""

    __slots__ = ()
    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if isinstance(kind, str):
            _KINDS[kind] = cls  # the slotted class dataclass() makes replaces the first

    def to_json(self) -> dict[str, Any]:
        """The message's fields as JSON-ready values (what ``--json`` prints)."""
        out = dump(self)
        assert isinstance(out, dict)
        return out


def kinds() -> dict[str, type[Message]]:
    """Every registered message kind (a copy)."""
    return dict(_KINDS)


# -- encoding ---------------------------------------------------------------------------


def dump(value: Any) -> Any:
    """*value* as JSON-ready data: dataclasses become objects (their own ``to_json`` is
    not used: the wire carries raw fields), enums their values, tuples lists."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        if all(isinstance(x, (str, int, float, bool)) or x is None for x in value):
            return list(value)
        return [dump(x) for x in value]
    if isinstance(value, dict):
        return {str(k): dump(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in _fields(type(value))}
    raise TypeError(f"cannot encode {type(value).__name__} in a kvfs message")


def encode(msg: Message) -> bytes:
    """The frame of *msg*: one JSON line."""
    body: dict[str, Any] = {"v": VERSION, "kind": msg.kind}
    for name, enc in _encoders(type(msg)):
        value = getattr(msg, name)
        body[name] = value if enc is None else enc(value)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


_Enc = Callable[[Any], Any] | None  # None: the value is JSON as it is
_ENCODERS: dict[type, list[tuple[str, _Enc]]] = {}


def _encoders(cls: type) -> list[tuple[str, _Enc]]:
    out = _ENCODERS.get(cls)
    if out is None:
        hints = typing.get_type_hints(cls)
        out = _ENCODERS[cls] = [(f.name, _encoder(hints[f.name])) for f in _fields(cls)]
    return out


def _encoder(tp: Any) -> _Enc:
    """How a value of type *tp* becomes JSON data: None when it already is (primitives
    and lists of them, trusted because the messages are built by typed code)."""
    if tp in _PRIMITIVES or tp is Any:
        return None if tp is not Any else dump
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if all(a in _PRIMITIVES for a in args):
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1 and len(args) == 2:
            inner = _encoder(options[0]) or _identity
            return lambda v: None if v is None else inner(v)
        return dump
    if origin in (list, tuple):
        item = _encoder(args[0]) if args else dump
        if item is None:
            return None if origin is list else list
        return lambda v: [item(x) for x in v]
    if origin is dict:
        val = _encoder(args[1]) if args else dump
        if val is None:
            return None
        return lambda v: {k: val(x) for k, x in v.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        cls = tp

        def record(v: Any) -> Any:
            out = {}
            for name, enc in _encoders(cls):
                x = getattr(v, name)
                out[name] = x if enc is None else enc(x)
            return out

        return record
    return dump


def _identity(v: Any) -> Any:
    return v


# -- decoding ---------------------------------------------------------------------------


def decode(line: bytes | str, *, max_values: int | None = None) -> Message:
    """The message in one frame (without or with its newline). Raises
    :class:`ProtocolError` (or its subclasses) saying what is wrong. *max_values*: refuse,
    before parsing, a frame of more values than that (the daemon passes
    :data:`MAX_VALUES` for requests)."""
    if len(line) > MAX_FRAME:
        raise ProtocolError(f"a frame of {len(line)} bytes is longer than the limit of {MAX_FRAME}; split the batch")
    if max_values is not None:
        values = (line.count(b",") if isinstance(line, bytes) else line.count(",")) + 1
        if values > max_values:
            raise ProtocolError(
                f"a frame of {values} values (its commas counted, names' included) is more than a request may hold "
                f"({max_values}: at most {MAX_ITEMS} names or ids per request); split the batch"
            )
    try:
        body = json.loads(line, parse_constant=_NonFinite)
    except RecursionError:
        raise ProtocolError(
            "a frame nests deeper than the decoder's limit (about 1000 levels); kvfs messages nest a few levels"
        ) from None
    except ValueError:
        raise ProtocolError("a frame is not JSON; each message is one JSON object per line") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"a frame is a JSON object, not {type(body).__name__}")
    v = body.pop("v", None)
    if v != VERSION:
        raise VersionMismatch(
            f"protocol version {v!r} is not spoken here (this side speaks version {VERSION}); "
            "use the same kvfs release on both sides (remount after upgrading)"
        )
    kind = body.pop("kind", None)
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UnknownKind(f"unknown message kind {kind!r}")
    try:
        msg: Message = _fast_builder(cls)(body)
    except _Bad:
        msg = _build(cls, body, kind)  # the careful path names what is wrong
    return msg


class _Bad(Exception):
    """A value the fast path does not take; the careful path says why."""


class _NonFinite:
    """What the decoder makes of ``NaN``, ``Infinity`` and ``-Infinity`` (which JSON does
    not have, and Python's decoder accepts): a value of no field's type, so the field
    that carries one is refused by name."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_FAST: dict[type, Callable[[Any], Any]] = {}


def _fast_builder(cls: type) -> Callable[[Any], Any]:
    """A builder of *cls* from a JSON object that checks every field with as little
    work as possible and raises :class:`_Bad` on anything unusual (no messages)."""
    known = _FAST.get(cls)
    if known is not None:
        return known
    hints = typing.get_type_hints(cls)
    plan: list[tuple[str, bool, frozenset[type] | None, bool, Callable[[Any], Any] | None, Bounds | None]] = []
    for f in _fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        tp = hints[f.name]
        types_ = _FLAT.get(tp)  # a primitive: checked inline
        if tp in (int, int | None):
            types_ = None  # its range is checked by the converter
        conv = None if types_ is not None else _fast(tp)
        plan.append((f.name, required, types_, tp in (float, float | None), conv, _bounds(f)))
    names = frozenset(f.name for f in _fields(cls))

    def build(v: Any) -> Any:
        if type(v) is not dict or not v.keys() <= names:
            raise _Bad
        kw = {}
        for name, required, types_, as_float, conv, bounds in plan:
            if name in v:
                x = v[name]
                if types_ is not None:
                    if type(x) not in types_:
                        raise _Bad
                    if as_float and x is not None:
                        x = _finite(x)
                else:
                    assert conv is not None
                    x = conv(x)
                if bounds is not None and not bounds.fast(x):
                    raise _Bad
                kw[name] = x
            elif required:
                raise _Bad
        return cls(**kw)

    _FAST[cls] = build
    return build


def _bounds(f: dataclasses.Field[Any]) -> Bounds | None:
    b = f.metadata.get("bounds")
    return b if isinstance(b, Bounds) else None


def _finite(x: Any) -> float:
    """*x* (an int or a float) as a finite float; :class:`_Bad` otherwise."""
    try:
        out = float(x)
    except OverflowError:
        raise _Bad from None
    if not math.isfinite(out):
        raise _Bad
    return out


def _in_range(values: list[Any]) -> bool:
    """Every int of *values* (ints and Nones) fits in 64 bits."""
    ints = [x for x in values if x is not None] if None in values else values
    return not ints or (min(ints) >= _INT_RANGE[0] and max(ints) <= _INT_RANGE[1])


def _fast(tp: Any) -> Callable[[Any], Any]:
    """The fast path's converter for one value of type *tp* (see :func:`_fast_builder`)."""
    flat = _FLAT.get(tp)
    if flat is not None and tp is not float:
        checks_range = int in flat

        def prim(v: Any) -> Any:
            if type(v) not in flat:
                raise _Bad
            if checks_range and type(v) is int and not _INT_RANGE[0] <= v <= _INT_RANGE[1]:
                raise _Bad
            return v

        return prim
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, tuple) and args and args[0] in _FLAT and args[0] is not float:
        kinds_ = _FLAT[args[0]]
        make = list if origin is list else tuple
        ints = int in kinds_

        def flat_list(v: Any) -> Any:
            if type(v) is not list or not set(map(type, v)) <= kinds_:
                raise _Bad
            if ints and not _in_range(v):
                raise _Bad
            return v if make is list else tuple(v)

        return flat_list
    if origin in (list, tuple) and args and args[0] is not float:
        item = _fast(args[0])
        make2 = list if origin is list else tuple

        def seq(v: Any) -> Any:
            if type(v) is not list:
                raise _Bad
            return make2(item(x) for x in v)

        return seq
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1 and len(args) == 2 and dataclasses.is_dataclass(options[0]):
            inner = _fast(options[0])
            return lambda v: None if v is None else inner(v)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _fast_builder(tp)
    slow = _converter(tp)  # enums, dicts, floats, other unions: the careful converter

    def careful(v: Any) -> Any:
        try:
            return slow(v, "")
        except ProtocolError:
            raise _Bad from None

    return careful


def _build(cls: type[T], body: dict[str, Any], where: str) -> T:
    fields = _compiled(cls)
    unknown = [k for k in body if k not in fields]
    if unknown:
        raise ProtocolError(f"{where}: unknown field {unknown[0]!r}; fields are {', '.join(fields) or 'none'}")
    kwargs = {}
    for name, (conv, required, bounds) in fields.items():
        if name in body:
            if bounds is not None and bounds.items is not None and type(body[name]) in (list, dict):
                bounds.check(body[name], f"{where}.{name}")  # the length before converting each item
            value = conv(body[name], f"{where}.{name}")
            if bounds is not None:
                bounds.check(value, f"{where}.{name}")
            kwargs[name] = value
        elif required:
            raise ProtocolError(f"{where}: missing field {name!r}")
    return cls(**kwargs)


_Conv = Callable[[Any, str], Any]
_FIELDS: dict[type, tuple[dataclasses.Field[Any], ...]] = {}
_COMPILED: dict[type, dict[str, tuple[_Conv, bool, Bounds | None]]] = {}


def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    f = _FIELDS.get(cls)
    if f is None:
        f = _FIELDS[cls] = tuple(x for x in dataclasses.fields(cls) if x.init)
    return f


def _compiled(cls: type) -> dict[str, tuple[_Conv, bool, Bounds | None]]:
    out = _COMPILED.get(cls)
    if out is None:
        hints = typing.get_type_hints(cls)
        out = {}
        for f in _fields(cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            out[f.name] = (_converter(hints[f.name]), required, _bounds(f))
        _COMPILED[cls] = out
    return out


def _wrong(where: str, expected: str, value: Any) -> ProtocolError:
    if value is None:
        got = "null"
    elif isinstance(value, _NonFinite):
        got = repr(value)
    elif type(value) is float and not math.isfinite(value):
        got = repr(value)  # 1e999 decodes as inf
    elif type(value) is int and not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        got = "an integer wider than 64 bits"
    else:
        got = type(value).__name__
    return ProtocolError(f"{where}: expected {expected}, got {got}")


def _is_number(v: Any) -> bool:
    if type(v) is float:
        return math.isfinite(v)
    if type(v) is int:
        return -(2**1023) < v < 2**1023  # converts to a finite float
    return False


_PRIMITIVES: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    int: ("an integer", lambda v: type(v) is int and _INT_RANGE[0] <= v <= _INT_RANGE[1]),
    str: ("a string", lambda v: type(v) is str),
    bool: ("true or false", lambda v: type(v) is bool),
    float: ("a finite number", _is_number),
    type(None): ("null", lambda v: v is None),
}


# element types whose lists are checked in one pass: the JSON types each may arrive as
_FLAT: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    str: frozenset({str}),
    bool: frozenset({bool}),
    float: frozenset({int, float}),
    int | None: frozenset({int, type(None)}),
    float | None: frozenset({int, float, type(None)}),
    str | None: frozenset({str, type(None)}),
}


def _flat_checks(
    item_tp: Any, flat_types: frozenset[type]
) -> tuple[Callable[[Any], bool], Callable[[list[Any]], bool]]:
    """For a list of *item_tp* (whose items are of *flat_types*): a check of one item, and
    a check of the whole list once its types are right (integers in 64 bits, numbers
    finite)."""

    def ok(x: Any) -> bool:
        if x is None:
            return type(None) in flat_types
        if type(x) not in flat_types:
            return False
        if float in flat_types and type(x) in (int, float):
            return _is_number(x)
        return type(x) is not int or _INT_RANGE[0] <= x <= _INT_RANGE[1]

    if float in flat_types:
        return ok, lambda v: all(x is None or _is_number(x) for x in v)
    if int in flat_types:
        return ok, _in_range
    return ok, lambda v: True


def _converter(tp: Any) -> _Conv:
    """A function checking (and converting) one JSON value of type *tp*."""
    if tp is Any:
        return lambda v, where: v
    if tp in _PRIMITIVES:
        what, ok = _PRIMITIVES[tp]
        as_float = tp is float

        def prim(v: Any, where: str) -> Any:
            if not ok(v):
                raise _wrong(where, what, v)
            return float(v) if as_float else v

        return prim
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        optional = len(options) < len(args)
        convs = [_converter(a) for a in options]

        def union(v: Any, where: str) -> Any:
            if v is None and optional:
                return None
            errors = []
            for c in convs:
                try:
                    return c(v, where)
                except ProtocolError as exc:
                    errors.append(str(exc))
            raise ProtocolError(errors[0] if len(errors) == 1 else f"{where}: {v!r} matches none of its types")

        return union
    if origin in (list, tuple):
        item_tp = args[0] if args else Any
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise TypeError(f"only homogeneous tuples (tuple[X, ...]) are supported, not {tp}")
        make = list if origin is list else tuple
        flat_types = _FLAT.get(item_tp)
        if flat_types is not None:
            what = _PRIMITIVES[item_tp][0] if item_tp in _PRIMITIVES else "a value"
            ok, valid = _flat_checks(item_tp, flat_types)
            as_floats = item_tp is float

            def flat(v: Any, where: str) -> Any:
                if type(v) is not list:
                    raise _wrong(where, "a list", v)
                if not set(map(type, v)) <= flat_types or not valid(v):  # in C, not a call per item, when all is well
                    bad = next(i for i, x in enumerate(v) if not ok(x))
                    raise _wrong(f"{where}[{bad}]", what, v[bad])
                if as_floats:
                    v = [float(x) for x in v]
                return v if make is list else tuple(v)

            return flat
        conv = _converter(item_tp)

        def seq(v: Any, where: str) -> Any:
            if type(v) is not list:
                raise _wrong(where, "a list", v)
            return make(conv(x, f"{where}[{i}]") for i, x in enumerate(v))

        return seq
    if origin is dict:
        key_tp, val_tp = args if args else (str, Any)
        if key_tp is not str:
            raise TypeError(f"only string-keyed dicts are supported, not {tp}")
        conv = _converter(val_tp)

        def mapping(v: Any, where: str) -> Any:
            if type(v) is not dict:
                raise _wrong(where, "an object", v)
            return {k: conv(x, f"{where}.{k}") for k, x in v.items()}

        return mapping
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = {m.value: m for m in tp}

        def member(v: Any, where: str) -> Any:
            try:
                return values[v]
            except (KeyError, TypeError):
                raise ProtocolError(f"{where}: {v!r} is not one of {', '.join(repr(k) for k in values)}") from None

        return member
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        cls = tp

        def nested(v: Any, where: str) -> Any:
            if type(v) is not dict:
                raise _wrong(where, "an object", v)
            return _build(cls, dict(v), where)

        return nested
    raise TypeError(f"kvfs messages cannot carry {tp!r}")


# -- framing ----------------------------------------------------------------------------


class LineBuffer:
    """Bytes in, whole frames out: feed what a socket returned, take the complete lines.
    A line longer than :data:`MAX_FRAME` raises :class:`ProtocolError` (the stream cannot
    be resynchronised after it: close the connection)."""

    __slots__ = ("_buf", "_scan")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Append *data*; the lines now complete (without their newlines), in order."""
        buf = self._buf
        buf += data
        lines = []
        start = 0
        end = buf.find(b"\n", self._scan)
        while end >= 0:
            lines.append(bytes(buf[start:end]))
            start = end + 1
            end = buf.find(b"\n", start)
        if start:
            del buf[:start]
        self._scan = len(buf)  # no newline before this: the next search starts here
        if len(buf) > MAX_FRAME:
            raise ProtocolError(f"a frame is longer than the limit of {MAX_FRAME} bytes; split the batch")
        return lines

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)
