"""When an operation on a name waits for a closed file's RELEASE (``Writes.settle`` with
``BackgroundRequests``; docs/mount-internals.md, "Close-to-open").

In this process, on trio's virtual clock (``autojump``): a wait that should not happen
shows as time passing, one that should shows as the caller still waiting when the
RELEASE comes. No FUSE here; the ordering on a real mount is
tests/mount/test_mount_close_to_open.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from kvfs.mount.background import BackgroundRequests
from kvfs.mount.inodes import InodeTable
from kvfs.mount.writes import WriteHandle, Writes

HOUR = 3600.0


def run(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def closing(limit: int) -> tuple[Writes, WriteHandle]:
    """A version of "f" whose descriptor was closed (FLUSH) and not yet released."""
    background = BackgroundRequests(limit)
    writes = Writes(cap=64 << 20, max_block=1 << 20, release_wait=HOUR, background=background)
    v = writes.start("f", InodeTable().new("f", False))
    writes.opened(v)
    return writes, WriteHandle(v.node, v)


async def settle_time(writes: Writes, *, ordered: bool = True) -> float:
    t0 = trio.current_time()
    await writes.settle("f", ordered=ordered)
    return trio.current_time() - t0


def test_a_close_whose_release_would_have_been_read_first_is_not_waited_for():
    """Fewer background requests than the kernel's limit since the FLUSH: the RELEASE of
    a last close would have come before this request. No RELEASE came: a duplicate's
    close, answered at once (release_wait is an hour)."""

    async def main() -> None:
        writes, h = closing(limit=4)
        for _ in range(2):
            writes.background.arrived()  # unanswered at the FLUSH: counted
        await writes.flush(h)
        writes.background.answered()
        writes.background.arrived()
        writes.background.answered()
        assert await settle_time(writes) == 0

    run(main)


def test_a_close_the_kernel_may_have_held_back_waits_for_its_release():
    """As many background requests as the kernel's limit since the FLUSH (counting those
    unanswered at it): the kernel may have held the RELEASE back behind them, so the
    request waits for it — until the RELEASE comes, with no time limit but release_wait."""

    async def main() -> None:
        writes, h = closing(limit=4)
        writes.background.arrived()  # one in flight at the FLUSH
        await writes.flush(h)
        for _ in range(3):
            writes.background.arrived()
            writes.background.answered()
        released = trio.Event()

        async def release_later() -> None:
            await trio.sleep(5)
            assert writes.released(h.version)
            writes.end(h.version)  # what the last release does when it publishes nothing
            released.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            waited = await settle_time(writes)
        assert released.is_set() and waited == 5

    run(main)


def test_a_held_back_release_is_waited_for_at_most_release_wait():
    async def main() -> None:
        writes, h = closing(limit=1)
        await writes.flush(h)
        writes.background.arrived()
        assert await settle_time(writes) == HOUR

    run(main)


def test_a_write_after_the_flush_ends_the_wait():
    async def main() -> None:
        writes, h = closing(limit=4)
        await writes.flush(h)
        await writes.write(h.version, 0, b"more")  # a duplicate's close: the file goes on
        for _ in range(8):
            writes.background.arrived()
        assert await settle_time(writes) == 0

    run(main)


def test_a_request_from_outside_the_fuse_queue_waits_for_the_queue_to_drain():
    """The batch client's request has no order with the kernel's queue: it waits until
    that queue has been read (the RELEASE, if any, with it), then decides as above; where
    the transport cannot tell, up to release_wait, as every close once did."""

    async def main() -> None:
        writes, h = closing(limit=4)
        await writes.flush(h)
        drains = 0

        async def drained_after_a_while() -> bool:
            nonlocal drains
            drains += 1
            await trio.sleep(2)
            return True

        writes.background.attach(4, drained_after_a_while)
        assert await settle_time(writes, ordered=False) == 2
        assert drains == 1
        assert await settle_time(writes, ordered=True) == 0

        writes.background.attach(4)  # a transport that cannot tell (pyfuse3)
        assert await settle_time(writes, ordered=False) == HOUR

    run(main)
