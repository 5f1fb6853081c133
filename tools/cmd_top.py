"""``kvfs top``: a live view of tier use, hit ratios, bytes moved per second and errors.

A stream, like ``kvfs events``: with ``--json`` each frame is one JSON object on a line of
its own (flushed), so ``kvfs top --json | jq`` and line readers see every frame as it
comes; ``--once`` stops after the first (and ``--count N`` after N)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from kvfs.protocol import Top, TopResult

from .control_client import add_socket_option, clients_for
from .flags import positive_int, seconds
from .render import format_size, table
from .scratch import end_on_sigterm

_CLEAR = "\x1b[H\x1b[2J"
MIN_INTERVAL = 0.1  # seconds: a faster refresh only loads the daemon


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Live view of a mount, refreshed every --interval seconds: per tier use, share of reads "
        "served (hit ratio), bytes read and written per second, promotions, demotions and "
        "evictions per second, corrupt copies, errors and health; on a cluster node, per peer "
        "the blocks read from it per second, their bytes, the mean time of a read, blocks it "
        "read from this node, misses, errors, corrupt reads and reads given up with every "
        "landing buffer busy; FUSE operations per second and the mean time the daemon took for each, "
        "when the mount records them. Rates "
        "are over the last "
        "interval. Ctrl-C quits."
    )
    parser.add_argument(
        "mountpoint", nargs="?", default=".", metavar="MOUNTPOINT", help="a kvfs mount or a path inside it (default: .)"
    )
    parser.add_argument(
        "--interval",
        type=seconds(MIN_INTERVAL),
        default=1.0,
        metavar="SECONDS",
        help=f"refresh period, at least {MIN_INTERVAL:g} (default: 1)",
    )
    parser.add_argument("--once", action="store_true", help="print one frame (rates over one interval) and exit")
    parser.add_argument("--count", type=positive_int, metavar="N", help="print N frames and exit")
    parser.add_argument(
        "--json",
        action="store_true",
        help="each frame as one JSON object on its own line (a stream, as kvfs events --json)",
    )
    add_socket_option(parser)


def frame(prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
    """Rates and ratios between two ``top`` snapshots (see :meth:`ControlHandler.op_top`)."""
    dt = max(cur["time"] - prev["time"], 1e-9)
    ps, cs = prev["statistics"], cur["statistics"]
    lookups = cs["lookups"] - ps["lookups"]
    misses = cs["misses"] - ps["misses"]
    tiers = []
    for p, c in zip(ps["tiers"], cs["tiers"]):
        hits = c["hits"] - p["hits"]
        tiers.append(
            {
                "name": c["name"],
                "kind": c["kind"],
                "capacity": c["capacity"],
                "used": c["used"],
                "blocks": c["blocks"],
                "healthy": c["healthy"],
                "hits_per_s": hits / dt,
                "hit_ratio": hits / lookups if lookups else None,
                "read_bytes_per_s": (c["bytes_read"] - p["bytes_read"]) / dt,
                "written_bytes_per_s": (c["bytes_written"] - p["bytes_written"]) / dt,
                "promotions_per_s": (c["promotions"] - p["promotions"]) / dt,
                "demotions_per_s": (c["demotions"] - p["demotions"]) / dt,
                "evictions_per_s": (c["evictions"] - p["evictions"]) / dt,
                "corrupt": c["corrupt"],
                "errors": c["errors"],
            }
        )
    prev_peers = {p["name"]: p for p in ps.get("peers", [])}
    peers = []
    for c in cs.get("peers", []):
        p = prev_peers.get(c["name"], c)
        hits = c["hits"] - p["hits"]
        peers.append(
            {
                "name": c["name"],
                "healthy": c["healthy"],
                "blocks": c["blocks"],
                "hits_per_s": hits / dt,
                "read_bytes_per_s": (c["bytes_read"] - p["bytes_read"]) / dt,
                "fetch_ms": 1e3 * (c["fetch_seconds"] - p["fetch_seconds"]) / hits if hits else None,
                "served_per_s": (c["served"] - p["served"]) / dt,
                "misses": c["misses"],
                "errors": c["errors"],
                "corrupt": c["corrupt"],
                "busy": c["busy"],
            }
        )
    prev_ops = {o["op"]: o for o in prev.get("ops", [])}
    ops, ops_us = {}, {}
    for o in cur.get("ops", []):
        p = prev_ops.get(o["op"], {"count": 0, "seconds": 0.0})
        n = o["count"] - p["count"]
        ops[o["op"]] = n / dt
        # the mean time the daemon spent on one such request over the interval (its handler,
        # from decoded request to reply): what `kvfs top` shows beside the rate
        ops_us[o["op"]] = 1e6 * (o["seconds"] - p["seconds"]) / n if n else None
    return {
        "time": cur["time"],
        "interval": dt,
        "mountpoint": cur["mountpoint"],
        "blocks": cs["blocks"],
        "lookups_per_s": lookups / dt,
        "hit_ratio": (lookups - misses) / lookups if lookups else None,
        "pending_writes": cs["pending_writes"],
        "events_dropped": cur["events_dropped"],
        "tiers": tiers,
        "peers": peers,
        "ops_per_s": ops,
        "ops_mean_us": ops_us,
    }


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def render(f: dict[str, Any]) -> str:
    head = (
        f"kvfs top  {f['mountpoint']}  {time.strftime('%H:%M:%S', time.localtime(f['time']))}  "
        f"blocks {f['blocks']}  reads/s {f['lookups_per_s']:.0f}  hit ratio {_pct(f['hit_ratio'])}  "
        f"pending writes {f['pending_writes']}  events dropped {f['events_dropped']}"
    )
    rows = []
    for t in f["tiers"]:
        cap = t["capacity"]
        rows.append(
            [
                t["name"],
                format_size(t["used"]),
                "unlimited" if cap is None else format_size(cap),
                "-" if not cap else f"{100 * t['used'] / cap:.0f}%",
                t["blocks"],
                _pct(t["hit_ratio"]),
                format_size(t["read_bytes_per_s"]) + "/s",
                format_size(t["written_bytes_per_s"]) + "/s",
                f"{t['promotions_per_s']:.0f}",
                f"{t['demotions_per_s']:.0f}",
                f"{t['evictions_per_s']:.0f}",
                t["corrupt"],
                t["errors"],
                "ok" if t["healthy"] else "UNHEALTHY",
            ]
        )
    body = table(
        [
            "TIER",
            "USED",
            "CAPACITY",
            "USE%",
            "BLOCKS",
            "HIT%",
            "READ",
            "WRITTEN",
            "PROMO/s",
            "DEMO/s",
            "EVICT/s",
            "CORRUPT",
            "ERRORS",
            "HEALTH",
        ],
        rows,
        right=tuple(range(1, 13)),
    )
    out = [head, "", body]
    if f.get("peers"):
        out += ["", render_peers(f["peers"])]
    busy = [(op, rate) for op, rate in f["ops_per_s"].items() if rate > 0]
    if busy:  # the ten busiest FUSE operations over the interval (none when idle)
        busiest = sorted(busy, key=lambda kv: -kv[1])[:10]
        means = f.get("ops_mean_us", {})
        out += [
            "",
            "fuse ops/s (mean µs each): "
            + "  ".join(f"{op} {rate:.0f} ({_us(means.get(op))})" for op, rate in busiest),
        ]
    return "\n".join(out)


def render_peers(peers: list[dict[str, Any]]) -> str:
    """The cluster's peers (docs/cluster.md): blocks read from each per second, bytes,
    the mean time of a read from it over the interval, blocks it read from this node."""
    rows = [
        [
            p["name"],
            "ok" if p["healthy"] else "UNHEALTHY",
            p["blocks"],
            f"{p['hits_per_s']:.0f}",
            format_size(p["read_bytes_per_s"]) + "/s",
            "-" if p["fetch_ms"] is None else f"{p['fetch_ms']:.1f}",
            f"{p['served_per_s']:.0f}",
            p["misses"],
            p["errors"],
            p["corrupt"],
            p["busy"],
        ]
        for p in peers
    ]
    heads = ["PEER", "HEALTH", "BLOCKS", "HITS/s", "READ", "FETCH ms", "SERVED/s", "MISSES", "ERRORS", "CORRUPT"]
    return table(heads + ["BUSY"], rows, right=tuple(range(2, 11)))


def run(args: argparse.Namespace) -> int:
    [(target, client)] = clients_for([args.mountpoint], args.socket)
    end_on_sigterm()
    frames = 1 if args.once else args.count
    shown = 0
    tty = sys.stdout.isatty() and not args.json and frames is None
    with client:
        prev = client.request(Top(), TopResult).to_json()
        if target.mountpoint is not None:
            prev["mountpoint"] = target.mountpoint
        while frames is None or shown < frames:
            time.sleep(args.interval)  # the refresh period itself, not a wait for something
            cur = client.request(Top(), TopResult).to_json()
            if target.mountpoint is not None:
                cur["mountpoint"] = target.mountpoint
            f = frame(prev, cur)
            prev = cur
            if args.json:
                text = json.dumps(f) + "\n"
            elif tty:
                text = _CLEAR + render(f) + "\n"
            else:  # frames one after another, a blank line between
                text = ("\n" if shown else "") + render(f) + "\n"
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except BrokenPipeError:  # `kvfs top --json | head -3`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
                return 0
            shown += 1
    return 0
