"""``kvfs bench quota``: what namespaces cost the store: quota accounting on a put, ``du``
of a namespace, a retention pass. Every figure is next to its baseline from the same run.

- **put**: seals of small blocks into a full DRAM tier (each put evicts one block, the
  steady state of a cache), through the store, with the default policy: without
  namespaces (the baseline), with namespaces configured but none over the blocks' path
  (a lookup), and with the blocks' namespace held to a DRAM quota (every put evicts within
  the namespace: its own eviction order kept beside the tier's). The block is small so
  that the bookkeeping, not the copy, is what is timed.
- **du**: ``Store.usage`` of a namespace's directory with few and with many blocks under it
  (the catalog's running totals: the same time whatever the count), and
  ``Store.namespace_statistics``.
- **retention**: a sweep over a namespace whose blocks are all younger than its retention
  (the pass walks them in batches; nothing is removed): microseconds per block.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

from kvfs.config import DramConfig, NamespaceConfig, PolicyConfig
from kvfs.names import TierName
from kvfs.policies import DEFAULT_POLICY
from kvfs.store import Store

from .flags import positive_int
from .render import table

_BLOCK = 4096


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blocks", type=positive_int, default=20_000, help="puts per pass (default 20000)")
    p.add_argument("--passes", type=positive_int, default=5, help="passes; the best is reported (default 5)")
    p.add_argument(
        "--du-blocks", type=positive_int, default=100_000, help="blocks under the large namespace (default 100000)"
    )
    p.add_argument("--policy", default=DEFAULT_POLICY, help=f"eviction policy (default {DEFAULT_POLICY})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _store(policy: str, capacity: int, namespaces: tuple[NamespaceConfig, ...] = ()) -> Store:
    from kvfs.tiers.dram import DramTier

    dram = DramTier(DramConfig(name=TierName("dram"), capacity=capacity, mlock=False, prefault=True))
    return Store([dram], policy=PolicyConfig(eviction=policy), namespaces=namespaces)


def _put_us(policy: str, n: int, passes: int, namespaces: tuple[NamespaceConfig, ...], prefix: str) -> float:
    """Microseconds per put of *n* blocks under *prefix* into a DRAM tier that holds n/4."""
    data = os.urandom(_BLOCK)
    best = float("inf")
    for _ in range(passes):
        store = _store(policy, (n // 4) * _BLOCK, namespaces)
        try:
            names = [f"{prefix}/{i % 256:02x}/{i:08x}" for i in range(n)]
            for name in names[: n // 4]:  # fill it first: every timed put evicts
                store.put(name + "-warm", data)
            t0 = time.perf_counter()
            for name in names:
                store.put(name, data)
            best = min(best, time.perf_counter() - t0)
        finally:
            store.close()
    return best / n * 1e6


def _call_us(fn: Callable[[], object], repeat: int = 2000) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / repeat * 1e6


def _du_figures(policy: str, big: int) -> dict[str, float]:
    store = _store(policy, (big + 2000) * _BLOCK, (NamespaceConfig(path="small"), NamespaceConfig(path="big")))
    try:
        data = os.urandom(64)
        for i in range(1000):
            store.put(f"small/{i % 256:02x}/{i}", data)
        for i in range(big):
            store.put(f"big/{i % 256:02x}/{i}", data)
        return {
            "du_small_us": _call_us(lambda: store.usage("small")),
            "du_big_us": _call_us(lambda: store.usage("big")),
            "namespace_statistics_us": _call_us(store.namespace_statistics),
        }
    finally:
        store.close()


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _retention_us(policy: str, n: int) -> float:
    from kvfs.tiers.dram import DramTier

    clock = _Clock()
    dram = DramTier(DramConfig(name=TierName("dram"), capacity=(n + 100) * _BLOCK, mlock=False, prefault=False))
    store = Store(
        [dram],
        policy=PolicyConfig(eviction=policy),
        clock=clock,
        namespaces=(NamespaceConfig(path="r", retention=1e9),),
    )
    try:
        data = os.urandom(64)
        for i in range(n):
            store.put(f"r/{i % 256:02x}/{i}", data)
        best = float("inf")
        for _ in range(3):
            store.lifetimes.reschedule()
            t0 = time.perf_counter()
            report = store.sweep()
            best = min(best, time.perf_counter() - t0)
            assert report.expired == 0
        return best / n * 1e6
    finally:
        store.close()


def run(args: argparse.Namespace) -> int:
    n, passes, policy = args.blocks, args.passes, args.policy
    quota = (n // 8) * _BLOCK  # half the tier
    base = _put_us(policy, n, passes, (), "t")
    elsewhere = _put_us(policy, n, passes, tuple(NamespaceConfig(path=f"o{i}") for i in range(16)), "t")
    held = _put_us(policy, n, passes, (NamespaceConfig(path="t", quota={"dram": quota}),), "t")
    du = _du_figures(policy, args.du_blocks)
    sweep = _retention_us(policy, args.du_blocks)
    load = os.getloadavg()[0]
    figures = {
        "policy": policy,
        "block_bytes": _BLOCK,
        "puts": n,
        "load1": load,
        "put_us": {"no_namespaces": base, "namespaces_elsewhere": elsewhere, "quota_held": held},
        "put_ratio": {"namespaces_elsewhere": elsewhere / base, "quota_held": held / base},
        "quota_accounting_us": held - base,
        **du,
        "du_ratio_big_vs_small": du["du_big_us"] / du["du_small_us"],
        "du_blocks": {"small": 1000, "big": args.du_blocks},
        "retention_sweep_us_per_block": sweep,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    rows = [
        ["put, no namespaces (baseline)", f"{base:.2f}", "1.00"],
        ["put, 16 namespaces elsewhere", f"{elsewhere:.2f}", f"{elsewhere / base:.2f}"],
        ["put, namespace held to its DRAM quota", f"{held:.2f}", f"{held / base:.2f}"],
        ["du of a namespace, 1000 blocks (baseline)", f"{du['du_small_us']:.2f}", "1.00"],
        [
            f"du of a namespace, {args.du_blocks} blocks",
            f"{du['du_big_us']:.2f}",
            f"{du['du_big_us'] / du['du_small_us']:.2f}",
        ],
        ["namespace_statistics (2 namespaces)", f"{du['namespace_statistics_us']:.2f}", "-"],
        [f"retention pass, per block ({args.du_blocks} blocks)", f"{sweep:.3f}", "-"],
    ]
    print(
        f"kvfs bench quota: {n} puts of {_BLOCK} B into a full DRAM tier, policy {policy}, "
        f"best of {passes}; load {load:.2f}"
    )
    print(table(["WHAT", "US", "RATIO"], rows, right=(1, 2)))
    print(f"quota accounting adds {held - base:.2f} us to a put that evicts")
    return 0
