"""``kvfs quota set`` / ``kvfs quota show``: namespaces' quotas per tier and their use."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from kvfs.errors import ConfigError
from kvfs.protocol import QuotaResult, QuotaSet, QuotaShow
from kvfs.units import format_duration, format_size, parse_duration, parse_size

from .control_client import add_socket_option, clients_for
from .render import print_json, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Namespaces (docs/tenants.md): a tenant's or model's directory with a quota per tier. A namespace "
        "over its quota evicts its own blocks, never another's; when all of them are pinned its writes "
        "fail with ENOSPC. Quotas set here last until the daemon stops; put them in [[namespaces]] to keep them."
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="each namespace's use against its quotas", description="Show namespaces.")
    show.add_argument(
        "path",
        nargs="?",
        default=".",
        metavar="PATH",
        help="a kvfs mount (every namespace) or a namespace's directory (default: .)",
    )
    show.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"namespaces": [{"path", "tiers": {TIER: {"used", "quota", "blocks", "evictions"}}, '
        '"blocks", "size", "refused", "expired", "retention", "retired", "owner", "group", "mode", ...}]}',
    )
    add_socket_option(show)
    set_ = sub.add_parser(
        "set",
        help="set a namespace's quotas (making it a namespace if it is not one)",
        description="Set quotas: kvfs quota set /mnt/kvfs/tenant-a --tier dram=1GiB --tier nvme=20GiB",
    )
    set_.add_argument("path", metavar="PATH", help="the namespace's directory inside a kvfs mount")
    set_.add_argument(
        "--tier",
        action="append",
        default=[],
        metavar="TIER=SIZE",
        help='a quota in one tier: a size ("512MiB"), or "none" to drop it; repeat for several tiers',
    )
    set_.add_argument(
        "--retention",
        default=None,
        metavar="DURATION",
        help='remove blocks not read for this long ("7d"); "none" drops it',
    )
    set_.add_argument("--json", action="store_true", help="print the namespace as quota show --json does")
    add_socket_option(set_)


def _quotas(specs: list[str]) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for spec in specs:
        tier, sep, size = spec.partition("=")
        if not sep or not tier:
            raise ConfigError("--tier", f"{spec!r}: write TIER=SIZE, like dram=1GiB (or dram=none)")
        try:
            out[tier] = None if size.strip().lower() in ("none", "unlimited") else parse_size(size)
        except ValueError as exc:
            raise ConfigError("--tier", f"{tier}: {exc}") from None
    return out


def run(args: argparse.Namespace) -> int:
    [(target, client)] = clients_for([args.path], args.socket)
    if args.action == "set":
        if not target.name:
            raise ConfigError("PATH", "the mount's root cannot be a namespace; name a directory in it")
        quotas = _quotas(args.tier)
        retention = None
        if args.retention is not None:
            try:
                retention = 0.0 if args.retention.lower() == "none" else parse_duration(args.retention)
            except ValueError as exc:
                raise ConfigError("--retention", str(exc)) from None
        if not quotas and retention is None:
            raise ConfigError("--tier", "give at least one --tier TIER=SIZE (or --retention)")
        ns = client.request(QuotaSet(name=target.name, quotas=quotas, retention=retention), QuotaResult).to_json()[
            "namespaces"
        ][0]
        spaces = [ns]
    else:
        res = client.request(QuotaShow(name=target.name or None), QuotaResult).to_json()
        spaces = res["namespaces"]
    if args.json:
        print_json({"namespaces": spaces})
        return 0
    print(render(spaces, target.display))
    return 0


def render(spaces: list[dict[str, Any]], display: Callable[[str], str] = lambda name: "/" + name) -> str:
    """The namespaces as a table: one row per namespace and tier (``kvfs df`` uses it too)."""
    if not spaces:
        return "no namespaces (kvfs quota set, or [[namespaces]] in the config)"
    rows = []
    for ns in spaces:
        first = True
        for tier, t in ns["tiers"].items():
            quota = t["quota"]
            if quota is None and not t["used"] and not first:
                continue
            rows.append(
                [
                    display(ns["path"]) if first else "",
                    tier,
                    format_size(t["used"]),
                    "-" if quota is None else format_size(quota),
                    "-" if not quota else f"{100 * t['used'] / quota:.0f}%",
                    t["blocks"],
                    t["evictions"],
                    _rules(ns) if first else "",
                ]
            )
            first = False
    return table(
        ["NAMESPACE", "TIER", "USED", "QUOTA", "USE%", "COPIES", "EVICTED", "RULES"], rows, right=(2, 3, 4, 5, 6)
    )


def _rules(ns: dict[str, Any]) -> str:
    parts = []
    if ns.get("owner") is not None:
        parts.append(f"owner {ns['owner']}:{ns['group']} {ns['mode']}")
    if ns.get("retention"):
        parts.append(f"retention {format_duration(ns['retention'])}")
    if ns.get("retired"):
        parts.append("RETIRED")
    if ns.get("refused"):
        parts.append(f"{ns['refused']} refused")
    if ns.get("weights"):
        parts.append(f"weights {ns['weights']}")
    return ", ".join(parts) or "-"
