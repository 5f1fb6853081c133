"""Config fields from TOML values: the closed sets a field takes, each field's conversion,
and the errors that name the field and say what is wrong (``kvfs.config`` builds the
config's tables with these).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import grp
import os
import pwd
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError
from .units import parse_duration, parse_size

__all__ = [
    "PromoteMode",
    "TierKind",
    "Transport",
    "WriteMode",
    "address",
    "build",
    "did_you_mean",
    "parse_id",
    "parsed",
    "unknown_key",
]

T = TypeVar("T")


class TierKind(enum.Enum):
    DRAM = "dram"
    DISK = "disk"
    POSIX = "posix"
    S3 = "s3"


class WriteMode(enum.Enum):
    """When a block sealed above reaches this tier.

    ``BACK``: only when it is evicted from the tier above (demotion). ``THROUGH``: soon
    after it is sealed, copied in the background, so other nodes see it.
    """

    BACK = "back"
    THROUGH = "through"


class Transport(enum.Enum):
    """How the mount talks to the kernel's FUSE (``[mount] transport``).

    ``KERNEL``: kvfs's own session layer on the kernel's protocol (``kvfs.mount.kernel``:
    passthrough of sealed blocks to their backing files when the daemon has
    ``CAP_SYS_ADMIN``, no flush round trip for read-only opens, 1 MiB requests).
    ``PYFUSE3``: pyfuse3 over libfuse. ``AUTO``: the kernel transport wherever it can
    mount (as root, or through fusermount3), else pyfuse3.
    """

    AUTO = "auto"
    KERNEL = "kernel"
    PYFUSE3 = "pyfuse3"


class PromoteMode(enum.Enum):
    """Whether a read served from a colder tier copies the block into the hottest tier."""

    ALWAYS = "always"
    SECOND_HIT = "second-hit"
    NEVER = "never"


_MIN_WRITE_BUFFER = 16 << 20

_POSITIVE = ("concurrency", "max_attempts", "max_connections", "max_connections_per_user")


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'capacity'?)"`` for the choice closest to a misspelled *word*,
    or ``""`` when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key(where: str, key: str, known: Iterable[str], listed: Iterable[str] | None = None) -> ConfigError:
    """The error for a key no table of this kind has, naming it: ``where.key: unknown
    key (did you mean …?); known keys are …``. *known*: every key this table takes;
    *listed*: the ones to list (default: all of them)."""
    known = list(known)
    listed = sorted(known if listed is None else listed)
    return ConfigError(
        f"{where}.{key}" if where else key,
        f"unknown key{did_you_mean(key, known)}; known keys are {', '.join(listed)}",
    )


def _convert(where: str, f: dataclasses.Field[Any], value: Any) -> Any:
    """Turn one TOML value into the field's type, or raise ConfigError naming *where*."""
    name = f.name
    try:
        if name == "capacity":
            if value in ("unlimited", "unbounded"):
                return None
            return parse_size(value)
        if name == "open_copies":
            return None if value == "auto" else parse_size(value)
        if name == "write_buffer":
            if value == "auto":
                return None
            n = parse_size(value)
            if n < _MIN_WRITE_BUFFER:
                raise ValueError(f'must be at least {_MIN_WRITE_BUFFER >> 20}MiB (or "auto")')
            return n
        if name in ("timeout", "negative_ttl", "listing_ttl", "hint_ttl", "lease_ttl"):
            return parse_duration(value)
        if name == "admit_threshold":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise ValueError("expected a share from 0 (admit every block) up to, not including, 1")
            return float(value)
        if name in ("multipart_threshold", "max_reserved", "copy_buffer", "max_inflight", "max_inflight_per_user"):
            return parse_size(value)
        if name == "write":
            return WriteMode(value)
        if name == "promote":
            return PromoteMode(value)
        if name == "transport":
            return Transport(value)
        if name in ("path", "socket"):
            if not isinstance(value, str) or not value:
                raise ValueError("expected a non-empty path string")
            return Path(os.path.abspath(os.path.expanduser(value)))  # the daemon runs in /
        if name in ("mlock", "prefault", "allow_other", "direct_io", "fsync", "group_writes"):
            if not isinstance(value, bool):
                raise ValueError("expected true or false")
            return value
        if name in (
            "concurrency",
            "max_attempts",
            "metrics_port",
            "block_size",
            "max_connections",
            "max_connections_per_user",
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name in _POSITIVE else 0):
                raise ValueError("expected a positive whole number")
            return value
        if name in (
            "name",
            "bucket",
            "prefix",
            "endpoint_url",
            "region",
            "eviction",
            "group",
            "zmq",
            "topic",
            "audience",
        ):
            if not isinstance(value, str):
                raise ValueError("expected a string")
            return value
    except ValueError as exc:
        msg = str(exc)
        if "is not a valid" in msg:  # enum lookup
            enum_cls = {"write": WriteMode, "promote": PromoteMode, "transport": Transport}[name]
            values = [m.value for m in enum_cls]
            msg = f"{value!r} is not one of {', '.join(map(repr, values))}{did_you_mean(value, values)}"
        raise ConfigError(where, msg) from None
    raise ConfigError(where, "unsupported field")  # pragma: no cover - every field is handled


def build(cls: type, where: str, table: Any, skip: tuple[str, ...] = ()) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(where, f"expected a table, got {type(table).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in skip}
    unknown = sorted(set(table) - set(fields) - set(skip))
    if unknown:
        raise unknown_key(where, unknown[0], [*fields, *skip], fields)
    kwargs = {}
    for key, value in table.items():
        if key in skip:
            continue
        kwargs[key] = _convert(f"{where}.{key}" if where else key, fields[key], value)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}" if where else missing[0], "missing required key")
    return cls(**kwargs)


def address(where: str, value: Any) -> str:
    """A ``host:port`` string (IPv6 hosts in brackets), or ConfigError."""
    if not isinstance(value, str):
        raise ConfigError(where, 'expected "host:port", e.g. "10.0.0.1:7470"')
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(where, f'{value!r} is not "host:port" with a port from 1 to 65535')
    return value


def parsed(where: str, parse: Callable[[Any], T], value: Any) -> T:
    """``parse(value)``, its ``ValueError`` a :class:`ConfigError` naming *where*."""
    try:
        return parse(value)
    except ValueError as exc:
        raise ConfigError(where, str(exc)) from None


def parse_id(where: str, value: Any, kind: str) -> int | None:
    """A uid or gid: a number, or a name looked up in the passwd or group database."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(where, f"expected a {kind} name or a numeric id")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(where, f"a {kind} id is not negative")
        return value
    try:
        return pwd.getpwnam(value).pw_uid if kind == "user" else grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(where, f"no {kind} named {value!r} on this machine; give a numeric id") from None
