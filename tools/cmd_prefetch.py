"""``kvfs prefetch``: bring blocks up to a tier now."""

from __future__ import annotations

import argparse
import sys

from kvfs.protocol import Prefetch

from .control_client import add_progress_option, add_socket_option, clients_for, run_with_progress
from .render import print_json_each


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Copy blocks into a tier now (the hottest, DRAM, by default) so the next read is a hit. "
        "A directory means every block under it. Shows a progress bar on a terminal for many blocks."
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="blocks or directories inside a kvfs mount")
    parser.add_argument("--tier", metavar="NAME", help="the tier to copy into (default: the hottest)")
    add_progress_option(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"path", "blocks", "tier", "fetched", "already", "failed": [{"name", "error", "type"}]} '
        "(one object per PATH; a list for several)",
    )
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    rc = 0
    results = []
    for target, client in clients_for(args.paths, args.socket):
        res = run_with_progress(
            client, target, Prefetch(paths=[target.name], tier=args.tier), f"prefetch {target.display()}", args.progress
        )
        if res.failed:
            rc = 1
        if args.json:
            results.append({"path": target.display(), **res.to_json()})
            continue
        print(
            f"prefetched {res.fetched} of {res.blocks} blocks under {target.display()} into {res.tier}"
            f" ({res.already} already there, {len(res.failed)} failed)"
        )
        for f in res.failed:
            print(f"kvfs: {target.display(f.name)}: {f.error}", file=sys.stderr)
    if args.json:
        print_json_each(results)
    return rc
