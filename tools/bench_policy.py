"""``kvfs bench policy``: hit ratio of every eviction policy on traces, against Belady and LRU.

Replays each trace (``--trace FILE`` in the Mooncake format, ``--workload NAME`` from the
generator; the shared Mooncake trace when neither is given) at each ``--capacity`` with
each policy, and prints the prefix-aware block hit ratio, its ratio to Belady's optimum
and to LRU, and the bytes written and moved between tiers. ``--cost`` also times each
policy with a million blocks in it. Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from kvfs.errors import KvfsError
from kvfs.policies import POLICIES
from kvfs.units import format_size

from .policy_cost import measure_cost
from .replay import BELADY, BLOCK_BYTES, ReplayStats, parse_stack, replay
from .traces import WORKLOADS, Trace, find_mooncake, generate, load_mooncake

__all__ = ["add_arguments", "run"]


class BenchError(KvfsError):
    """A bad ``kvfs bench policy`` argument: the message names it and the reason."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace", action="append", default=[], metavar="FILE", help="Mooncake-format jsonl trace (repeatable)"
    )
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help=f"generated workload: {', '.join(WORKLOADS)} or 'all' (repeatable)",
    )
    parser.add_argument(
        "--capacity",
        nargs="+",
        default=None,
        metavar="CAP",
        help="tier capacities in blocks: '2000,8000' is two runs, 'dram=1000,disk=8000' "
        "is a stack (hottest first); N%% means a share of the trace's distinct "
        "blocks (default: 5%% 10%% 20%% 40%%)",
    )
    parser.add_argument(
        "--policies",
        default=None,
        metavar="LIST",
        help=f"comma-separated policies, LRU always included (default: all: {', '.join(POLICIES)})",
    )
    parser.add_argument("--requests", type=int, default=4000, help="requests per generated workload")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated workloads")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests of each trace")
    parser.add_argument(
        "--block-bytes",
        type=int,
        default=BLOCK_BYTES,
        help=f"bytes per block (default {BLOCK_BYTES}: 512 tokens of Llama-3.1-8B fp16 KV)",
    )
    parser.add_argument("--cost", action="store_true", help="also time each policy with --cost-blocks blocks resident")
    parser.add_argument("--cost-blocks", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _traces(args) -> list[Trace]:
    traces = []
    for path in args.trace:
        try:
            traces.append(load_mooncake(path, limit=args.limit))
        except OSError as exc:
            raise BenchError(f"--trace {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise BenchError(f"--trace: {exc}") from exc
    names = [w for item in args.workload for w in (WORKLOADS if item == "all" else [item])]
    for name in names:
        if name not in WORKLOADS:
            raise BenchError(f"--workload {name!r}: known workloads are {', '.join(WORKLOADS)}, all")
        t = generate(name, requests=args.requests, seed=args.seed)
        if args.limit is not None:
            t = Trace(name=t.name, requests=t.requests[: args.limit])
        traces.append(t)
    if not traces:
        found = find_mooncake()
        if found is None:
            raise BenchError("no --trace or --workload given and the shared Mooncake trace was not found")
        traces.append(load_mooncake(found, limit=args.limit))
    return traces


def _capacities(args) -> list[str]:
    out = []
    for item in args.capacity or ["5%", "10%", "20%", "40%"]:
        out.extend([item] if "=" in item else [c for c in item.split(",") if c.strip()])
    return out


def _policies(args) -> list[str]:
    if args.policies is None:
        return list(POLICIES)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in names:
        if p not in POLICIES and p != BELADY:
            raise BenchError(f"--policies: unknown policy {p!r}; known: {', '.join(POLICIES)}")
    names = [p for p in names if p != BELADY]
    return names if "lru" in names else ["lru", *names]  # the reference for "x LRU"


def _row(trace: Trace, cap: str, s: ReplayStats, belady: ReplayStats, lru: ReplayStats | None) -> dict:
    return {
        "trace": trace.name,
        "capacity": cap,
        "tiers": [{"name": t.name, "capacity": t.capacity} for t in s.tiers],
        "policy": s.policy,
        "hit_ratio": s.hit_ratio,
        "vs_belady": s.hit_ratio / belady.hit_ratio if belady.hit_ratio else None,
        "vs_lru": s.hit_ratio / lru.hit_ratio if lru and lru.hit_ratio else None,
        "hits": s.hits,
        "accesses": s.accesses,
        "tier_hits": list(s.tier_hits),
        "bytes_written": s.bytes_written,
        "bytes_moved": s.bytes_moved,
        "promotions": s.promotions,
        "demotions": s.demotions,
    }


def _summary(rows: list[dict], policies: list[str]) -> list[dict]:
    """Per policy over every (trace, capacity): geometric mean and worst of the ratios."""
    out = []
    for p in [BELADY, *policies]:
        mine = [r for r in rows if r["policy"] == p]
        vb = [r["vs_belady"] for r in mine if r["vs_belady"]]
        vl = [r["vs_lru"] for r in mine if r["vs_lru"]]
        out.append(
            {
                "policy": p,
                "runs": len(mine),
                "mean_hit_ratio": sum(r["hit_ratio"] for r in mine) / len(mine) if mine else 0.0,
                "geomean_vs_belady": math.exp(sum(map(math.log, vb)) / len(vb)) if vb else None,
                "min_vs_belady": min(vb) if vb else None,
                "geomean_vs_lru": math.exp(sum(map(math.log, vl)) / len(vl)) if vl else None,
                "min_vs_lru": min(vl) if vl else None,
            }
        )
    return out


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _print_tables(rows: list[dict], summary: list[dict], cost: list[dict], block_bytes: int) -> None:
    print(f"prefix-aware block hit ratio; bytes at {format_size(block_bytes)} per block")
    key = None
    for r in rows:
        if (r["trace"], r["capacity"]) != key:
            key = (r["trace"], r["capacity"])
            stack = ",".join(f"{t['name']}={t['capacity']}" for t in r["tiers"])
            stack = str(r["tiers"][0]["capacity"]) if len(r["tiers"]) == 1 else stack
            print(f"\n{r['trace']}  capacity {r['capacity']} ({stack} blocks)")
            print(
                f"  {'policy':<14} {'hit ratio':>9} {'x Belady':>9} {'x LRU':>7} {'written':>11} {'moved':>11}"
                f" {'top-tier hits':>14}"
            )
        top = r["tier_hits"][0] / r["hits"] if r["hits"] else 0.0
        print(
            f"  {r['policy']:<14} {r['hit_ratio']:>9.4f} {_fmt(r['vs_belady'], '.3f'):>9} "
            f"{_fmt(r['vs_lru'], '.3f'):>7} {format_size(r['bytes_written']):>11} {format_size(r['bytes_moved']):>11}"
            f" {top:>14.1%}"
        )
    print("\nacross all traces and capacities (geometric mean, worst)")
    print(f"  {'policy':<14} {'x Belady':>9} {'worst':>7} {'x LRU':>7} {'worst':>7}")
    for s in summary:
        print(
            f"  {s['policy']:<14} {_fmt(s['geomean_vs_belady'], '.3f'):>9} {_fmt(s['min_vs_belady'], '.3f'):>7} "
            f"{_fmt(s['geomean_vs_lru'], '.3f'):>7} {_fmt(s['min_vs_lru'], '.3f'):>7}"
        )
    if cost:
        print(f"\npolicy cost at {cost[0]['blocks']:,} blocks (one decision = one insert/touch/victim/remove call)")
        print(f"  {'policy':<14} {'fill/s':>12} {'decisions/s':>12}")
        for c in cost:
            print(f"  {c['policy']:<14} {c['fill_per_s']:>12,.0f} {c['decisions_per_s']:>12,.0f}")


def run(args) -> int:
    traces = _traces(args)
    caps = _capacities(args)
    policies = _policies(args)
    progress = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    rows = []
    for trace in traces:
        distinct = trace.distinct
        progress(f"{trace.name}: {len(trace.requests)} requests, {trace.accesses} accesses, {distinct} distinct blocks")
        for cap in caps:
            try:
                tiers = parse_stack(cap, distinct=distinct)
            except ValueError as exc:
                raise BenchError(f"--capacity: {exc}") from exc
            t0 = time.perf_counter()
            results = {p: replay(trace.requests, tiers, p, block_bytes=args.block_bytes) for p in [BELADY, *policies]}
            progress(f"  capacity {cap}: {len(results)} replays in {time.perf_counter() - t0:.1f}s")
            belady, lru = results[BELADY], results.get("lru")
            rows.extend(_row(trace, cap, s, belady, lru) for s in results.values())
    summary = _summary(rows, policies)
    cost = []
    if args.cost:
        for p in policies:
            progress(f"cost: {p} at {args.cost_blocks:,} blocks")
            c = measure_cost(p, blocks=args.cost_blocks)
            cost.append(
                {
                    "policy": p,
                    "blocks": c.blocks,
                    "fill_per_s": c.fill_per_s,
                    "decisions": c.decisions,
                    "decisions_per_s": c.decisions_per_s,
                }
            )
    if args.json:
        json.dump(
            {"block_bytes": args.block_bytes, "results": rows, "summary": summary, "cost": cost}, sys.stdout, indent=1
        )
        print()
    else:
        _print_tables(rows, summary, cost, args.block_bytes)
    return 0
