"""Who made the FUSE request being handled: its :class:`RequestContext`.

pyfuse3 hands a context (``uid``, ``gid``, ``pid``, ``umask``) to some handlers only (not
to ``read``, ``write``, ``flush``, ``release``, ``fsync``, ``forget``); the kernel
transport (:mod:`kvfs.mount.kernel`) knows it for every request (``fuse_in_header``).
It sets :func:`current` for the handler it runs, whatever the handler, so code that needs
the requester of a request without a ``ctx`` argument (a ``flush`` that must know which
process closed a file) asks :func:`current`; under pyfuse3 it answers None for those.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

__all__ = ["RequestContext", "current", "reset_current", "set_current"]


@dataclass(slots=True)
class RequestContext:
    """The requester of one FUSE request: the attribute names of pyfuse3's
    ``RequestContext``, so handlers read either alike."""

    uid: int
    gid: int
    pid: int
    umask: int = 0


_CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("kvfs_fuse_request", default=None)


def current() -> RequestContext | None:
    """The context of the request this task is handling (kernel transport), or None."""
    return _CURRENT.get()


def set_current(ctx: RequestContext | None) -> contextvars.Token[RequestContext | None]:
    """Set by the transport before it runs a handler (each worker task handles one
    request at a time, so the variable is the task's own)."""
    return _CURRENT.set(ctx)


def reset_current(token: contextvars.Token[RequestContext | None]) -> None:
    """Undo :func:`set_current` once the handler is done."""
    _CURRENT.reset(token)
