"""Block events: what happened to which block in which tier, queued for the owner to drain.

The store appends; the daemon drains (``EventLog.drain``) and fans out to ``kvfs events``
subscribers and routers. No callbacks into upper layers. The queue is bounded: when
nobody drains, the oldest events are dropped and counted in ``dropped``.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "EventKind", "EventLog"]


class EventKind(enum.Enum):
    STORED = "stored"  # a block was sealed (written or replaced) into a tier
    PROMOTED = "promoted"  # copied into a hotter tier after a read or prefetch
    DEMOTED = "demoted"  # copied into a colder tier (eviction or write-through)
    EVICTED = "evicted"  # a copy was dropped from a tier to make room (or by request)
    REMOVED = "removed"  # the block was deleted (unlink) or lost its last copy
    CORRUPT = "corrupt"  # a copy failed its checksum and was dropped
    RENAMED = "renamed"  # the block was renamed (``detail`` holds the old name)


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    time: float
    kind: EventKind
    name: str
    tier: str | None = None
    size: int = 0
    detail: str = ""
    #: the block's parent in its prefix chain, when its writer gave one (routers' events)
    parent: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "kind": self.kind.value,
            "name": self.name,
            "tier": self.tier,
            "size": self.size,
            "detail": self.detail,
            "parent": self.parent,
        }


class EventLog:
    """A bounded, thread-safe FIFO of :class:`Event` with increasing ``seq`` numbers."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self._q: deque[Event] = deque()
        self._maxlen = maxlen
        self._seq = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def emit(
        self,
        time: float,
        kind: EventKind,
        name: str,
        tier: str | None = None,
        size: int = 0,
        detail: str = "",
        parent: str | None = None,
    ) -> None:
        with self._lock:
            self._seq += 1
            if len(self._q) >= self._maxlen:
                self._q.popleft()
                self.dropped += 1
            self._q.append(Event(self._seq, time, kind, name, tier, size, detail, parent))

    @property
    def seq(self) -> int:
        """The ``seq`` of the last event emitted (0: none yet); later events have larger ones."""
        return self._seq

    def drain(self) -> list[Event]:
        """Every queued event, oldest first; the queue is empty afterwards."""
        with self._lock:
            out = list(self._q)
            self._q.clear()
            return out
