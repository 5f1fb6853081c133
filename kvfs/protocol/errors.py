"""One table for the errors that cross the socket, both ways.

The daemon answers a failed request with an :class:`Error` frame naming the error's class
(``{"kind": "error", "type": "BlockNotFound", "message": "..."}``); the client raises that
class again with the same message, so ``except BlockNotFound`` works across processes as
it does in one. :data:`ERRORS` lists every class that may cross, the same discipline as
errno in ``kvfs.mount``. A class the other side does not know arrives as
:class:`RemoteError` (its ``type`` is the name sent); an unlisted subclass is sent as its
nearest listed base, so nothing is lost silently.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from kvfs import errors as core

from .codec import Message, ProtocolError, UnknownKind, VersionMismatch

__all__ = [
    "ERRORS",
    "ControlError",
    "DaemonNotAnswering",
    "Error",
    "InternalError",
    "LeaseEnded",
    "PermissionDenied",
    "RemoteError",
    "SubscriberTooSlow",
    "error_type",
    "rebuild",
]


class PermissionDenied(core.KvfsError):
    """Raised when the peer may not do what it asked: a put by a reader, an operator
    command through a group socket (see docs/client.md, "Security")."""


class ControlError(core.KvfsError):
    """Raised by an op for a request that cannot be served as asked (an unknown tier)."""


class SubscriberTooSlow(core.KvfsError):
    """Raised to an ``events`` subscriber whose backlog passed the hub's buffer: it was
    cut off rather than let one slow reader hold events back from the others."""


class InternalError(core.KvfsError):
    """Raised for a bug in the daemon while serving a request (it is logged there; the
    daemon keeps serving)."""


class LeaseEnded(core.KvfsError):
    """Raised when a lease or a reservation is used after it ended: released, past its
    deadline, or its client gone. A view's bytes may belong to another block then."""


class DaemonNotAnswering(core.KvfsError):
    """Raised on the client side when the daemon's socket is missing, refuses, hangs up
    or times out (``why`` says which). Never sent over the wire."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why or message


class RemoteError(core.KvfsError):
    """An error of a class this side does not know (a newer daemon); ``type`` is its name."""

    def __init__(self, message: str, type: str = "") -> None:
        super().__init__(message)
        self.type = type


ERRORS: tuple[type[core.KvfsError], ...] = (
    core.KvfsError,
    core.ConfigError,
    core.InvalidName,
    core.BlockNotFound,
    core.BlockExists,
    core.BlockCorrupt,
    core.NoSpace,
    core.TierFull,
    core.TierUnavailable,
    core.NotADirectory,
    core.IsADirectory,
    core.DirectoryNotEmpty,
    core.ReadOnlyBlock,
    core.StoreBusy,
    core.TierInUse,
    core.DescriptorsExhausted,
    core.LimitReached,
    core.OutOfMemory,
    core.LastCopy,
    core.Pinned,
    ProtocolError,
    UnknownKind,
    VersionMismatch,
    PermissionDenied,
    core.AccessDenied,
    ControlError,
    SubscriberTooSlow,
    InternalError,
    LeaseEnded,
)
_BY_NAME: dict[str, type[core.KvfsError]] = {c.__name__: c for c in ERRORS}


def error_type(exc: BaseException) -> str:
    """The name *exc* crosses the wire as: its class, or its nearest listed base."""
    if isinstance(exc, RemoteError) and exc.type:
        return exc.type
    for cls in type(exc).__mro__:
        if cls in _BY_NAME.values() and _BY_NAME.get(cls.__name__) is cls:
            return cls.__name__
    return core.KvfsError.__name__


def rebuild(type_name: str, message: str) -> core.KvfsError:
    """The exception an :class:`Error` frame stands for (``str(exc) == message``)."""
    cls = _BY_NAME.get(type_name)
    if cls is None:
        return RemoteError(message, type_name)
    exc = cls.__new__(cls)
    core.KvfsError.__init__(exc, message)  # the classes with their own __init__ take other arguments
    if isinstance(exc, core.ConfigError):
        exc.field, exc.reason = "", message
    elif isinstance(exc, core.StoreBusy):
        exc.tier = None
    return exc


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Error(Message):
    """A failed request: the error's class name (:data:`ERRORS`) and its message."""

    kind: ClassVar[str] = "error"
    type: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> Error:
        return cls(type=error_type(exc), message=str(exc))

    def exception(self) -> core.KvfsError:
        return rebuild(self.type, self.message)
