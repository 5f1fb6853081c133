"""Fan-out of block events: every subscriber gets every published event, in order, through
a bounded queue of its own.

The store queues its events; the control server's pump drains that queue every 20 ms and
hands each drain to :meth:`EventHub.publish`, which appends it to every subscriber's
queue, on the loop, without waiting for anyone. A subscriber that falls *buffer* events
behind loses the events that do not fit: they are dropped and counted, and the
subscriber finds a :class:`Gap` (how many it lost) where they would have been, so it can
tell its own receiver (``kvfs events`` is cut off with ``SubscriberTooSlow``; the ZMQ
publisher sends ``AllBlocksCleared``, the resync of vLLM's event format). Nothing a
subscriber does, or fails to do, can hold the others back or end the daemon: the queues
never block and never close under a reader.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from kvfs.events import Event

__all__ = ["EventHub", "Gap", "Subscription"]


@dataclass(frozen=True, slots=True)
class Gap:
    """*count* events a subscriber lost here (its queue was full): what came before this
    marker and what comes after are in order, but not contiguous."""

    count: int


class Subscription:
    """One subscriber's queue: at most *buffer* events, a :class:`Gap` where events were
    dropped. *cut_off*: after its first gap the subscriber takes nothing more (it is about
    to hang up: ``kvfs events`` ends a stream that lost events)."""

    def __init__(self, buffer: int, *, cut_off: bool, after: int = 0) -> None:
        self.buffer = buffer
        self.cut_off = cut_off
        self.after = after
        """The last ``seq`` it must not get (what happened before it subscribed)."""
        self.cut = False
        self.lost = 0
        """Events dropped for this subscriber, in all."""
        self._items: deque[Event | Gap] = deque()
        self._queued = 0  # events in _items (gaps not counted)
        self._waiting = trio.lowlevel.ParkingLot()

    def push(self, events: list[Event]) -> None:
        """Queue *events* (on the loop, never waiting); what does not fit is dropped and
        counted as one gap."""
        if self.cut:
            return
        if events and events[0].seq <= self.after:
            events = [ev for ev in events if ev.seq > self.after]
        room = max(0, self.buffer - self._queued)
        take = events if room >= len(events) else events[:room]
        self._items.extend(take)
        self._queued += len(take)
        lost = len(events) - len(take)
        if lost:
            self.lost += lost
            last = self._items[-1] if self._items else None
            if isinstance(last, Gap):
                self._items[-1] = Gap(last.count + lost)
            else:
                self._items.append(Gap(lost))
            self.cut = self.cut_off
        if self._items:
            self._waiting.unpark_all()

    async def receive(self) -> list[Event | Gap]:
        """Everything queued, in order (waiting until there is something)."""
        while not self._items:
            await self._waiting.park()
        items = list(self._items)
        self._items.clear()
        self._queued = 0
        return items

    @property
    def queued(self) -> int:
        return self._queued


class EventHub:
    """Every published event to every subscriber, each through its own bounded queue of
    *buffer* events (see the module doc). The buffer holds one publish's burst:
    the pump drains every 20 ms, so 10k events keep up with 500k events/s."""

    def __init__(self, buffer: int = 10_000) -> None:
        self.buffer = buffer
        self._subs: list[Subscription] = []
        self.dropped = 0
        """Events dropped for subscribers that fell behind, in all."""
        self._joined = trio.Event()  # set when a subscriber joins

    @property
    def subscribers(self) -> int:
        """Subscribers receiving events (not counting any cut off but not yet gone)."""
        return sum(1 for s in self._subs if not s.cut)

    @contextmanager
    def subscribe(self, *, cut_off: bool = True, after: int = 0) -> Iterator[Subscription]:
        """A queue receiving every event published while the ``with`` block is open whose
        ``seq`` is above *after* (the store's :attr:`~kvfs.events.EventLog.seq` when
        subscribing: nothing that happened before); see :class:`Subscription` for *cut_off*."""
        sub = Subscription(self.buffer, cut_off=cut_off, after=after)
        self._subs.append(sub)
        self._joined.set()
        try:
            yield sub
        finally:
            self._subs.remove(sub)

    async def until_subscribed(self) -> None:
        """Return once someone subscribes (at once if someone does)."""
        while not self.subscribers:
            if self._joined.is_set():
                self._joined = trio.Event()
            await self._joined.wait()

    def publish(self, events: list[Event]) -> None:
        for sub in self._subs:
            before = sub.lost
            sub.push(events)
            self.dropped += sub.lost - before
