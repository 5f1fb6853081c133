"""Errors to errno: the one table, and the wrapper every FUSE handler runs in.

The only exception a handler raises to pyfuse3 is ``FUSEError``. :func:`errno_of` is the
one place a :class:`~kvfs.errors.KvfsError` (or an ``OSError``) becomes an errno;
:func:`handler` times each request into the mount's
:class:`~kvfs.mount.opstats.OpStats` and converts whatever it raised. docs/SEMANTICS.md
lists which errno each operation answers with.
"""

from __future__ import annotations

import errno
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, NoReturn, ParamSpec, Protocol, TypeVar

from pyfuse3 import FUSEError

from kvfs.errors import (
    AccessDenied,
    BlockCorrupt,
    BlockExists,
    BlockNotFound,
    ConfigError,
    CrossNamespace,
    DescriptorsExhausted,
    DirectoryNotEmpty,
    InvalidName,
    IsADirectory,
    KvfsError,
    NamespaceRetired,
    NoSpace,
    NotADirectory,
    OutOfMemory,
    ReadOnlyBlock,
    TierFull,
    TierUnavailable,
)

from .opstats import OpStats

__all__ = ["errno_of", "handler", "refused"]

log = logging.getLogger("kvfs.mount.fs")

# KvfsError class -> errno; the first matching base class wins (most specific first).
_ERRNO: tuple[tuple[type[BaseException], int], ...] = (
    (BlockNotFound, errno.ENOENT),  # missing, evicted, every copy bad: a miss, never EIO
    (BlockCorrupt, errno.ENOENT),
    (NoSpace, errno.ENOSPC),
    (TierFull, errno.ENOSPC),
    (IsADirectory, errno.EISDIR),
    (NotADirectory, errno.ENOTDIR),
    (DirectoryNotEmpty, errno.ENOTEMPTY),
    (BlockExists, errno.EEXIST),
    (ReadOnlyBlock, errno.EPERM),
    (InvalidName, errno.EINVAL),
    (ConfigError, errno.EINVAL),
    (DescriptorsExhausted, errno.EMFILE),  # the daemon's descriptors, not the tier: it stays healthy
    (OutOfMemory, errno.ENOMEM),  # [mount] open_copies
    (TierUnavailable, errno.EHOSTDOWN),  # the block exists, but the tiers holding it are down
    (CrossNamespace, errno.EXDEV),  # mv copies and removes instead
    (NamespaceRetired, errno.EROFS),
    (AccessDenied, errno.EACCES),
)


def errno_of(exc: BaseException) -> int:
    """The errno a failed store call answers with: the one place errors become errno."""
    if isinstance(exc, FUSEError):
        return exc.errno
    for cls, code in _ERRNO:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO


class _Timed(Protocol):
    """What a handler's owner has: ``opstats``."""

    @property
    def opstats(self) -> OpStats: ...


_O = TypeVar("_O", bound=_Timed)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def handler(fn: Callable[Concatenate[_O, _P], Awaitable[_R]]) -> Callable[Concatenate[_O, _P], Coroutine[Any, Any, _R]]:
    """Time the handler into ``self.opstats`` and convert every error to FUSEError."""
    op = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: _O, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        t0 = time.perf_counter()
        try:
            result = await fn(self, *args, **kwargs)
        except FUSEError:
            self.opstats.observe(op, time.perf_counter() - t0, True)
            raise
        except (KvfsError, OSError) as exc:
            self.opstats.observe(op, time.perf_counter() - t0, True)
            code = errno_of(exc)
            if code == errno.EIO:
                log.warning("%s failed: %s", op, exc)
            raise FUSEError(code) from exc
        except Exception as exc:  # a bug must fail one request, not take the mount down
            self.opstats.observe(op, time.perf_counter() - t0, True)
            log.exception("%s failed unexpectedly; answering EIO", op)
            raise FUSEError(errno.EIO) from exc
        self.opstats.observe(op, time.perf_counter() - t0, False)
        return result

    return wrapper


def refused(op: str, code: int) -> Callable[..., Coroutine[Any, Any, NoReturn]]:
    """A handler for an operation kvfs never supports: counts it and answers *code*."""

    async def refuse(self: _Timed, *args: object) -> NoReturn:
        self.opstats.observe(op, 0.0, True)
        raise FUSEError(code)

    refuse.__name__ = op
    refuse.__doc__ = f"{op}: always {errno.errorcode[code]} (docs/SEMANTICS.md)."
    return refuse
