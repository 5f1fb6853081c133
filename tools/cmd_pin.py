"""``kvfs pin`` / ``kvfs unpin``: keep blocks where they are, or let them go again."""

from __future__ import annotations

import argparse
import sys

from kvfs.protocol import Pin, PinResult

from .control_client import about, add_socket_option, clients_for
from .flags import seconds
from .render import print_json_each


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if parser.prog.endswith("unpin"):
        parser.description = (
            "Unpin blocks: they become eviction candidates again. A directory unpins everything under it."
        )
    else:
        parser.description = (
            "Pin blocks: a pinned block stays in the tiers it is in and is never evicted, by policy or by "
            "kvfs evict (unless --force); writes fail with ENOSPC when a tier is all pinned. A directory pins "
            "every block under it."
        )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="blocks or directories inside a kvfs mount")
    if not parser.prog.endswith("unpin"):
        parser.add_argument(
            "--for",
            dest="ttl",
            type=seconds(),
            default=None,
            metavar="DURATION",
            help='a soft pin: it ends by itself after DURATION ("90s", "10m", "2h", "7d")',
        )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"path", "pinned", "blocks", "changed", "failed": [{"name", "error", "type"}]} '
        "(one object per PATH; a list for several)",
    )
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    pinned = args.command == "pin"
    ttl = getattr(args, "ttl", None)
    rc = 0
    results = []
    for target, client in clients_for(args.paths, args.socket):
        with about(target):
            res = client.request(Pin(paths=[target.name], pinned=pinned, ttl=ttl), PinResult)
        if res.failed:
            rc = 1
        if args.json:
            results.append({"path": target.display(), "pinned": pinned, **res.to_json()})
            continue
        verb = "pinned" if pinned else "unpinned"
        print(
            f"{verb} {res.blocks} block{'s' if res.blocks != 1 else ''} under {target.display()} ({res.changed} changed)"
        )
        for f in res.failed:
            print(f"kvfs: {target.display(f.name)}: {f.error}", file=sys.stderr)
    if args.json:
        print_json_each(results)
    return rc
