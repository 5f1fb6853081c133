"""``kvfs evict``: drop local copies of blocks, never the last one unless asked."""

from __future__ import annotations

import argparse
import sys

from kvfs.protocol import Evict

from .control_client import add_socket_option, clients_for, run_with_progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Drop copies of blocks from a tier, or from every local (non-shared) tier. A copy that "
        "is a block's last is first written down to a colder tier; if none takes it the block "
        "is kept and reported, unless --force, which drops it (the block is gone). "
        "A directory means every block under it. Unlike unlink, shared tiers are untouched."
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="blocks or directories inside a kvfs mount")
    parser.add_argument("--tier", metavar="NAME", help="drop only the copy in this tier")
    parser.add_argument("--force", action="store_true", help="drop a last copy too (the block is lost)")
    parser.add_argument(
        "--progress", action="store_true", help="draw the progress bar on stderr even when it is not a terminal"
    )
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    rc = 0
    for target, client in clients_for(args.paths, args.socket):
        res = run_with_progress(
            client,
            target,
            Evict(paths=[target.name], tier=args.tier, force=args.force),
            f"evict {target.display()}",
            args.progress,
        )
        print(
            f"evicted {res.evicted} of {res.blocks} blocks under {target.display()}"
            f" ({res.removed} removed entirely, {len(res.failed)} kept)"
        )
        for f in res.failed:
            print(f"kvfs evict: {target.display(f.name)}: {f.error}", file=sys.stderr)
            rc = 1
    return rc
