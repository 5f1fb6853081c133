"""``kvfs evict``: drop local copies of blocks, never a pinned block's or the last one
unless asked."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from kvfs.protocol import Evict

from .control_client import add_progress_option, add_socket_option, clients_for, run_with_progress
from .render import print_json_each

_WHY = {"Pinned": "pinned", "LastCopy": "last copy", "AccessDenied": "not allowed"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Drop copies of blocks from a tier, or from every local (non-shared) tier. A pinned block is "
        "refused (unpin it first), and a copy that is a block's last is first written down to a "
        "colder tier; if none takes it the block is kept. Both are reported, and make the exit "
        "status 1, unless --force, which evicts pinned blocks and drops last copies (those blocks "
        "are gone). A directory means every block under it. Unlike unlink, shared tiers are untouched."
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="blocks or directories inside a kvfs mount")
    parser.add_argument("--tier", metavar="NAME", help="drop only the copy in this tier")
    parser.add_argument(
        "--force", action="store_true", help="evict pinned blocks too, and drop last copies (the block is lost)"
    )
    add_progress_option(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"path", "blocks", "evicted", "removed", "kept": {WHY: N}, "failed": [{"name", '
        '"error", "type"}]} (one object per PATH; a list for several); WHY is an error type: Pinned, LastCopy, ...',
    )
    add_socket_option(parser)


def _kept(kinds: Counter[str]) -> str:
    """``": 2 pinned, 1 last copy"`` for the refusals, or ``""``."""
    if not kinds:
        return ""
    return ": " + ", ".join(f"{n} {_WHY.get(kind, kind)}" for kind, n in kinds.most_common())


def _why(name: str, error: str) -> str:
    """The daemon's reason without the block's name it starts with (the line names the
    path already): ``is pinned; unpin it first …``."""
    for lead in (f"{name!r}: ", f"{name!r} "):
        if error.startswith(lead):
            return error[len(lead) :]
    return error


def run(args: argparse.Namespace) -> int:
    rc = 0
    results = []
    for target, client in clients_for(args.paths, args.socket):
        res = run_with_progress(
            client,
            target,
            Evict(paths=[target.name], tier=args.tier, force=args.force),
            f"evict {target.display()}",
            args.progress,
        )
        kinds = Counter(f.type for f in res.failed)
        if res.failed:
            rc = 1
        if args.json:
            results.append({"path": target.display(), **res.to_json(), "kept": dict(kinds)})
            continue
        print(
            f"evicted {res.evicted} of {res.blocks} blocks under {target.display()}"
            f" ({res.removed} removed entirely, {len(res.failed)} kept{_kept(kinds)})"
        )
        for f in res.failed:
            print(f"kvfs: {target.display(f.name)}: {_why(f.name, f.error)}", file=sys.stderr)
    if args.json:
        print_json_each(results)
    return rc
