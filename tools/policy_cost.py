"""What a policy itself costs: decisions per second with a large catalog in it.

A *decision* is one call into the policy (insert, touch, victim or remove). The tier is
filled with ``blocks`` keys in prefix chains of 32, then each timed step plays what the
store does on a miss and a hit at a full tier: touch a resident block, insert a new one
under its chain parent, ask for a victim and remove it — four decisions per step. The
steps run in ``rounds`` and the fastest round counts, so a busy machine's pauses do not.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvfs.policies import make_policy

__all__ = ["CostStats", "measure_cost"]

CHAIN = 32


@dataclass(frozen=True, kw_only=True)
class CostStats:
    """Timings for one policy: fill rate and steady-state decisions per second."""

    policy: str
    blocks: int
    fill_per_s: float
    decisions: int
    decisions_per_s: float


def measure_cost(
    name: str, *, blocks: int = 1_000_000, steps: int = 200_000, rounds: int = 5, seed: int = 0
) -> CostStats:
    """Time policy *name* at *blocks* resident keys over *steps* steady-state steps."""
    rng = random.Random(seed)
    policy = make_policy(name)
    gc.collect()
    t0 = time.perf_counter()
    for k in range(blocks):
        policy.insert(k, 0, k - 1 if k % CHAIN else None)
    fill = time.perf_counter() - t0
    # Touch targets drawn ahead so the random generator is not timed.
    targets = [rng.randrange(blocks + steps) for _ in range(steps)]
    insert, touch, remove = policy.insert, policy.touch, policy.remove
    victim: Callable[[], Any] = policy.victim  # kvfs.policies is untyped
    per_round = max(1, steps // rounds)
    best = float("inf")
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in range(r * per_round, (r + 1) * per_round):
            touch(targets[i])
            k = blocks + i
            insert(k, 0, k - 1 if k % CHAIN else None)
            remove(victim())
        best = min(best, time.perf_counter() - t0)
    return CostStats(
        policy=name,
        blocks=blocks,
        fill_per_s=blocks / fill,
        decisions=4 * per_round * rounds,
        decisions_per_s=4 * per_round / best,
    )
