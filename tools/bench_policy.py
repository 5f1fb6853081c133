"""``kvfs bench policy``: hit ratio of every eviction policy on traces, against Belady and LRU.

Replays each trace (``--trace FILE`` in the Mooncake format, ``--workload NAME`` from the
generator; the shared Mooncake trace when neither is given) at each ``--capacity`` with
each policy, and prints the prefix-aware block hit ratio, its ratio to Belady's optimum
and to LRU, and the cost in writes: bytes written into each tier per hit (the top tier
takes the engine's writes and promotions, a colder tier the demotions it admitted: for a
disk tier, its SSD writes). ``--hints`` replays the policies that take hints a second
time with them (rows ``NAME +hints``). ``--cost`` also times each policy with a million
blocks in it, against ``lru`` and ``prefix-arc`` in the same run. Progress goes to
stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from kvfs.errors import KvfsError
from kvfs.policies import POLICIES, EvictionPolicy, PolicyContext, make_policy
from kvfs.units import format_size

from .flags import at_least, positive_int, share
from .policy_cost import measure_cost
from .replay import BELADY, BLOCK_BYTES, HintModel, ReplayStats, parse_stack, replay
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
        "blocks (default: 1%% 2%% 5%% 10%%)",
    )
    parser.add_argument(
        "--hints",
        default=None,
        metavar="SPEC",
        help="also replay the policies that take hints with them: soon=N (hint the request N ahead), "
        "ended=SHARE (of sessions that say they ended), delay=SECONDS (after their last request), "
        "e.g. soon=8,ended=0.5,delay=10",
    )
    parser.add_argument(
        "--admit-threshold",
        type=share,
        default=PolicyContext().admit_threshold,
        help="share of a kind of block that must be read from a colder tier for it to be admitted there "
        "(session-arc; 0 admits everything; default %(default)s)",
    )
    parser.add_argument(
        "--policies",
        default=None,
        metavar="LIST",
        help=f"comma-separated policies, LRU always included (default: all: {', '.join(POLICIES)})",
    )
    parser.add_argument("--requests", type=positive_int, default=4000, help="requests per generated workload")
    parser.add_argument("--seed", type=at_least(0), default=0, help="seed of the generated workloads")
    parser.add_argument(
        "--limit", type=positive_int, default=None, help="replay only the first N requests of each trace"
    )
    parser.add_argument(
        "--block-bytes",
        type=positive_int,
        default=BLOCK_BYTES,
        help=f"bytes per block (default {BLOCK_BYTES}: 512 tokens of Llama-3.1-8B fp16 KV)",
    )
    parser.add_argument("--cost", action="store_true", help="also time each policy with --cost-blocks blocks resident")
    parser.add_argument("--cost-blocks", type=positive_int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _traces(args: argparse.Namespace) -> list[Trace]:
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


def _capacities(args: argparse.Namespace) -> list[str]:
    out = []
    for item in args.capacity or ["1%", "2%", "5%", "10%"]:
        out.extend([item] if "=" in item else [c for c in item.split(",") if c.strip()])
    return out


def _policies(args: argparse.Namespace) -> list[str]:
    if args.policies is None:
        return list(POLICIES)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in names:
        if p not in POLICIES and p != BELADY:
            raise BenchError(f"--policies: unknown policy {p!r}; known: {', '.join(POLICIES)}")
    names = [p for p in names if p != BELADY]
    return names if "lru" in names else ["lru", *names]  # the reference for "x LRU"


def _hints(spec: str | None) -> HintModel | None:
    if spec is None:
        return None
    fields = {"soon": ("soon", int), "ended": ("ended", float), "delay": ("ended_delay", float)}
    kwargs = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in fields:
            raise BenchError(f"--hints: {part!r}: write soon=N, ended=SHARE or delay=SECONDS, comma-separated")
        name, conv = fields[key.strip()]
        try:
            kwargs[name] = conv(value)
        except ValueError:
            raise BenchError(f"--hints: {part!r}: {value!r} is not a number") from None
    try:
        model = HintModel(**kwargs)
    except ValueError as exc:
        raise BenchError(f"--hints: {exc}") from None
    if not model.active:
        raise BenchError("--hints: nothing to send; give soon=N (N > 0) or ended=SHARE (> 0)")
    return model


def _takes_hints(policy: str) -> bool:
    return type(make_policy(policy)).hint is not EvictionPolicy.hint


def _row(trace: Trace, cap: str, s: ReplayStats, belady: ReplayStats, lru: ReplayStats | None) -> dict[str, Any]:
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
        "tier_written": list(s.tier_written),
        "written_per_hit": [s.written_per_hit(i) for i in range(len(s.tiers))],
        "bytes_written": s.bytes_written,
        "bytes_moved": s.bytes_moved,
        "promotions": s.promotions,
        "demotions": s.demotions,
        "refused": s.refused,
        "hints": s.hints,
    }


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _summary(rows: list[dict[str, Any]], labels: list[str], *, stacks: bool) -> list[dict[str, Any]]:
    """Per policy over every (trace, capacity) of one kind (single tiers or stacks):
    geometric mean and worst of the ratios, and of the colder tiers' writes per hit
    against the reference policy's."""
    out = []
    for p in [BELADY, *labels]:
        mine = [r for r in rows if r["policy"] == p and (len(r["tiers"]) > 1) == stacks]
        if not mine:
            continue
        vb = [r["vs_belady"] for r in mine if r["vs_belady"]]
        vl = [r["vs_lru"] for r in mine if r["vs_lru"]]
        vw = [r["vs_reference_written"] for r in mine if r.get("vs_reference_written")]
        out.append(
            {
                "policy": p,
                "stacks": stacks,
                "runs": len(mine),
                "mean_hit_ratio": sum(r["hit_ratio"] for r in mine) / len(mine),
                "geomean_vs_belady": _geomean(vb),
                "min_vs_belady": min(vb) if vb else None,
                "geomean_vs_lru": _geomean(vl),
                "min_vs_lru": min(vl) if vl else None,
                "geomean_vs_reference_written": _geomean(vw),
                "max_vs_reference_written": max(vw) if vw else None,
            }
        )
    return out


def _fmt(x: object, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _per_hit(x: float | None) -> str:
    return "-" if x is None else format_size(round(x))


def _print_tables(
    rows: list[dict[str, Any]], summaries: list[dict[str, Any]], cost: list[dict[str, Any]], block_bytes: int, ref: str
) -> None:
    print(f"prefix-aware block hit ratio; bytes at {format_size(block_bytes)} per block")
    print("written/hit: bytes written into the tier per hit (engine writes and promotions into the top")
    print(f"tier, admitted demotions into the others); x {ref}: the colder tiers' writes per hit against {ref}'s")
    key = None
    for r in rows:
        if (r["trace"], r["capacity"]) != key:
            key = (r["trace"], r["capacity"])
            tiers = r["tiers"]
            stack = ",".join(f"{t['name']}={t['capacity']}" for t in tiers)
            stack = str(tiers[0]["capacity"]) if len(tiers) == 1 else stack
            print(f"\n{r['trace']}  capacity {r['capacity']} ({stack} blocks)")
            cols = "".join(f" {t['name'][:8] + ' w/hit':>15}" for t in tiers)
            extra = f" {'x ' + ref[:10]:>13} {'top-tier hits':>14}" if len(tiers) > 1 else ""
            print(f"  {'policy':<20} {'hit ratio':>9} {'x Belady':>9} {'x LRU':>7}{cols}{extra}")
        per_hit = "".join(f" {_per_hit(w):>15}" for w in r["written_per_hit"])
        extra = ""
        if len(r["tiers"]) > 1:
            top = r["tier_hits"][0] / r["hits"] if r["hits"] else 0.0
            extra = f" {_fmt(r.get('vs_reference_written'), '.2f'):>13} {top:>14.1%}"
        print(
            f"  {r['policy']:<20} {r['hit_ratio']:>9.4f} {_fmt(r['vs_belady'], '.3f'):>9} "
            f"{_fmt(r['vs_lru'], '.3f'):>7}{per_hit}{extra}"
        )
    for stacks in (False, True):
        part = [s for s in summaries if s["stacks"] == stacks]
        if not part:
            continue
        what = "tier stacks (Belady is a reference there, not a bound)" if stacks else "single tiers"
        print(f"\nacross all traces and capacities, {what} (geometric mean, worst)")
        head = f"  {'policy':<20} {'x Belady':>9} {'worst':>7} {'x LRU':>7} {'worst':>7}"
        print(head + (f" {'x ' + ref[:10] + ' w':>15} {'worst':>7}" if stacks else ""))
        for s in part:
            line = (
                f"  {s['policy']:<20} {_fmt(s['geomean_vs_belady'], '.3f'):>9} {_fmt(s['min_vs_belady'], '.3f'):>7} "
                f"{_fmt(s['geomean_vs_lru'], '.3f'):>7} {_fmt(s['min_vs_lru'], '.3f'):>7}"
            )
            if stacks:
                line += (
                    f" {_fmt(s['geomean_vs_reference_written'], '.3f'):>15}"
                    f" {_fmt(s['max_vs_reference_written'], '.3f'):>7}"
                )
            print(line)
    if cost:
        print(f"\npolicy cost at {cost[0]['blocks']:,} blocks (one decision = one insert/touch/victim/remove call)")
        print(f"  {'policy':<20} {'fill/s':>12} {'decisions/s':>12} {'x lru':>7} {'x prefix-arc':>13}")
        for c in cost:
            print(
                f"  {c['policy']:<20} {c['fill_per_s']:>12,.0f} {c['decisions_per_s']:>12,.0f} "
                f"{_fmt(c.get('vs_lru'), '.2f'):>7} {_fmt(c.get('vs_prefix_arc'), '.2f'):>13}"
            )


def _reference_writes(rows: list[dict[str, Any]], ref: str) -> None:
    """Fill ``vs_reference_written``: the colder tiers' bytes written per hit against *ref*'s run."""
    base = {(r["trace"], r["capacity"]): r for r in rows if r["policy"] == ref}
    for r in rows:
        b = base.get((r["trace"], r["capacity"]))
        if len(r["tiers"]) < 2 or b is None:
            continue
        mine, theirs = sum(r["tier_written"][1:]), sum(b["tier_written"][1:])
        if r["hits"] and b["hits"] and theirs:
            r["vs_reference_written"] = (mine / r["hits"]) / (theirs / b["hits"])


def run(args: argparse.Namespace) -> int:
    traces = _traces(args)
    caps = _capacities(args)
    policies = _policies(args)
    hints = _hints(args.hints)
    try:
        context = PolicyContext(admit_threshold=args.admit_threshold)
    except ValueError as exc:
        raise BenchError(f"--admit-threshold: {exc}") from None
    hinted = [p for p in policies if hints is not None and _takes_hints(p)]
    labels = [*policies, *(f"{p} +hints" for p in hinted)]
    ref = "prefix-arc" if "prefix-arc" in policies else "lru"
    progress: Callable[[str], None] = (
        (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    )
    rows = []
    for trace in traces:
        distinct = trace.distinct
        timed = "timed" if trace.timed else "untimed"
        progress(
            f"{trace.name}: {len(trace.requests)} requests ({timed}), {trace.accesses} accesses, "
            f"{distinct} distinct blocks"
        )
        for cap in caps:
            try:
                tiers = parse_stack(cap, distinct=distinct)
            except ValueError as exc:
                raise BenchError(f"--capacity: {exc}") from exc
            t0 = time.perf_counter()
            results = {
                p: replay(trace.requests, tiers, p, block_bytes=args.block_bytes, context=context)
                for p in [BELADY, *policies]
            }
            for p in hinted:
                s = replay(trace.requests, tiers, p, block_bytes=args.block_bytes, context=context, hints=hints)
                results[f"{p} +hints"] = s
            progress(f"  capacity {cap}: {len(results)} replays in {time.perf_counter() - t0:.1f}s")
            belady, lru = results[BELADY], results.get("lru")
            for label, s in results.items():
                row = _row(trace, cap, s, belady, lru)
                row["policy"] = label
                rows.append(row)
    _reference_writes(rows, ref)
    summaries = _summary(rows, labels, stacks=False) + _summary(rows, labels, stacks=True)
    cost: list[dict[str, Any]] = []
    if args.cost:
        for p in policies:
            progress(f"cost: {p} at {args.cost_blocks:,} blocks")
            stats = measure_cost(p, blocks=args.cost_blocks)
            cost.append(
                {
                    "policy": p,
                    "blocks": stats.blocks,
                    "fill_per_s": stats.fill_per_s,
                    "decisions": stats.decisions,
                    "decisions_per_s": stats.decisions_per_s,
                }
            )
        by = {c["policy"]: c["decisions_per_s"] for c in cost}
        for c in cost:
            c["vs_lru"] = c["decisions_per_s"] / by["lru"] if "lru" in by else None
            c["vs_prefix_arc"] = c["decisions_per_s"] / by["prefix-arc"] if "prefix-arc" in by else None
    if args.json:
        out = {
            "block_bytes": args.block_bytes,
            "hints": None if hints is None else vars(hints),
            "admit_threshold": args.admit_threshold,
            "reference": ref,
            "results": rows,
            "summary": summaries,
            "cost": cost,
        }
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        _print_tables(rows, summaries, cost, args.block_bytes, ref)
    return 0
