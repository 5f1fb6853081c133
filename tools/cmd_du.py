"""``kvfs du``: bytes and blocks per tier and in total under a path, from the catalog."""

from __future__ import annotations

import argparse

from kvfs.protocol import Du, DuResult

from .control_client import add_socket_option, replies_for
from .render import format_size, print_json_each, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Show how much the blocks under each PATH take in every tier and in total. Counted "
        "from the daemon's catalog (no file-tree walk). USED is what the copies take against "
        "each tier's capacity; SIZE is the blocks' payload bytes. A PATH that is a namespace also shows "
        "its use against its quotas."
    )
    parser.add_argument(
        "paths", nargs="*", default=["."], metavar="PATH", help="paths inside a kvfs mount (default: .)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"path", "tiers": {TIER: {"used", "blocks"}}, "total": {"used", "blocks", "size"}, '
        '"quota": {TIER: bytes or null} or null} (a list for several paths)',
    )
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    results = replies_for(args.paths, args.socket, lambda t: Du(name=t.name), DuResult)
    if args.json:
        print_json_each(results)
        return 0
    tiers = list(results[0]["tiers"])
    headers = []
    for t in tiers:
        headers += [t.upper(), "BLOCKS"]
    headers += ["TOTAL", "BLOCKS", "SIZE", "PATH"]
    rows = []
    for res in results:
        row = []
        for t in tiers:
            u = res["tiers"].get(t, {"used": 0, "blocks": 0})
            row += [format_size(u["used"]), u["blocks"]]
        tot = res["total"]
        row += [format_size(tot["used"]), tot["blocks"], format_size(tot["size"]), res["path"]]
        rows.append(row)
    print(table(headers, rows, right=tuple(range(len(headers) - 1))))
    for res in results:
        if res.get("quota"):
            parts = []
            for t, q in res["quota"].items():
                u = res["tiers"].get(t, {"used": 0})["used"]
                parts.append(f"{t} {format_size(u)}" + ("" if q is None else f" of {format_size(q)}"))
            print(f"{res['path']}: namespace; quota use: {', '.join(parts)}")
    return 0
