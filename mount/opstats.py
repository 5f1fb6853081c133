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


class OpStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._sum: dict[str, float] = {}
        self._hist: dict[str, list[int]] = {}

    def observe(self, op: str, seconds: float, error: bool = False) -> None:
        with self._lock:
            self._count[op] = self._count.get(op, 0) + 1
            self._sum[op] = self._sum.get(op, 0.0) + seconds
            if error:
                self._errors[op] = self._errors.get(op, 0) + 1
            h = self._hist.get(op)
            if h is None:
                h = self._hist[op] = [0] * (len(BUCKETS) + 1)
            h[bisect_left(BUCKETS, seconds)] += 1

    def snapshot(self) -> list[OpSnapshot]:
        with self._lock:
            out = []
            for op, count in sorted(self._count.items()):
                cum, acc = [], 0
                for c in self._hist[op]:
                    acc += c
                    cum.append(acc)
                out.append(OpSnapshot(op, count, self._errors.get(op, 0), self._sum[op], tuple(cum)))
            return out
