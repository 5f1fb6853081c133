"""Counts and latencies of FUSE operations, kept by the filesystem and read by metrics.

Plain Python objects (no Prometheus types) so several mounts in one process (tests) keep
separate figures; ``kvfs.mount.metrics`` exports them through a custom collector.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass

__all__ = ["BUCKETS", "OpSnapshot", "OpStats"]

BUCKETS: tuple[float, ...] = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass(frozen=True, slots=True)
class OpSnapshot:
    op: str
    count: int
    errors: int
    total_seconds: float
    buckets: tuple[int, ...]
    """Cumulative counts per upper bound in BUCKETS (Prometheus ``le``), then +Inf."""


class _Op:
    __slots__ = ("count", "errors", "hist", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.seconds = 0.0
        self.hist = [0] * (len(BUCKETS) + 1)


class OpStats:
    """Written by one thread (the FUSE loop: :meth:`observe` takes no lock, it is on every
    request's path), read by any (:meth:`snapshot`, consistent within each operation:
    the count is the sum of its buckets)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # only for adding an operation
        self._ops: dict[str, _Op] = {}

    def observe(self, op: str, seconds: float, error: bool = False) -> None:
        o = self._ops.get(op)
        if o is None:
            with self._lock:
                o = self._ops.setdefault(op, _Op())
        o.hist[bisect_left(BUCKETS, seconds)] += 1
        o.seconds += seconds
        if error:
            o.errors += 1
        o.count += 1

    def snapshot(self) -> list[OpSnapshot]:
        with self._lock:
            ops = sorted(self._ops.items())
        out = []
        for op, o in ops:
            cum, acc = [], 0
            for c in list(o.hist):
                acc += c
                cum.append(acc)
            out.append(OpSnapshot(op, acc, min(o.errors, acc), o.seconds, tuple(cum)))
        return out
