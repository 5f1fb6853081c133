"""Whether the kernel may still hold a file's RELEASE: the background requests read so far.

Close-to-open without a timed wait rests on two facts (docs/mount-internals.md, "Close-to-
open"): the kernel queues the RELEASE of a last close before ``close`` returns, straight
onto the queue the daemon reads in order, unless its background queue is full; and the
daemon marks a version sealing before the first checkpoint of the RELEASE handler, so any
request read after it waits for that seal. What is left is the full queue: the kernel
moves a background request (read-ahead READ, async WRITE, RELEASE, RELEASEDIR) onto the
pending queue only while fewer than ``max_background`` of them are in flight, and a
request queued behind a full one can be read before it.

:class:`BackgroundRequests` lets the daemon tell whether that could have happened to a close. At a
version's FLUSH it takes a :meth:`BackgroundRequests.mark`: the background-class requests read so
far less those still unanswered. Every background request in flight when that close
ended was either unanswered at the mark or read since, so if fewer than
``max_background`` were (:meth:`BackgroundRequests.may_hold`), the queue had room, the RELEASE (if
that close was the last) went straight onto the pending queue, and a request read after
the close came after it. The count is a superset (every READ and WRITE counts, not only
the kernel's asynchronous ones), so it errs toward waiting, never toward answering early.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["KERNEL_DEFAULT_MAX_BACKGROUND", "BackgroundRequests"]

KERNEL_DEFAULT_MAX_BACKGROUND = 12
"""``FUSE_DEFAULT_MAX_BACKGROUND``: what a connection has when its INIT reply asks for
none (libfuse 3.14 under pyfuse3 asks for none)."""


async def _unknown() -> bool:
    return False


class BackgroundRequests:
    """Background-class requests read and unanswered, on the loop (see the module doc).
    *limit*: the connection's ``max_background`` as the kernel granted it (set by the
    transport, :meth:`attach`); *drained*: returns True once every request the kernel had
    queued when it was called has been read, False where the transport cannot tell."""

    def __init__(self, limit: int = KERNEL_DEFAULT_MAX_BACKGROUND) -> None:
        self.limit = max(1, limit)
        self.read = 0
        self.unanswered = 0
        self.drained: Callable[[], Awaitable[bool]] = _unknown

    def attach(self, limit: int, drained: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.limit = max(1, limit)
        self.drained = drained if drained is not None else _unknown

    def arrived(self) -> None:
        """A READ, WRITE, RELEASE or RELEASEDIR was read (call before the handler's first await)."""
        self.read += 1
        self.unanswered += 1

    def answered(self) -> None:
        self.unanswered -= 1

    def __enter__(self) -> None:
        """``with background:`` around a handler of one of those requests."""
        self.arrived()

    def __exit__(self, *exc: object) -> None:
        self.answered()

    def mark(self) -> int:
        """Taken when a FLUSH is read: see :meth:`may_hold`."""
        return self.read - self.unanswered

    def may_hold(self, mark: int) -> bool:
        """Whether the kernel's background queue may have been full when the close whose
        FLUSH took *mark* ended (its RELEASE could then come after later requests)."""
        return self.read - mark >= self.limit
