"""``kvfs fsck``: verify every copy of every block on every tier."""

from __future__ import annotations

import argparse

from kvfs.protocol import Fsck

from .control_client import add_progress_option, add_socket_option, clients_for, run_with_progress
from .render import print_json

# Exit codes follow fsck(8): 0 clean, 1 errors corrected, 4 errors left uncorrected.
CLEAN, CORRECTED, UNCORRECTED = 0, 1, 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read every copy of every block on every tier and check it against the block's checksum. "
        "Reports bad copies; --repair drops them (reads then use the next good copy; a block with "
        "no good copy left is removed). Exit status as fsck(8): 0 clean, 1 bad copies dropped, "
        "4 bad copies found and left. Shows a progress bar on a terminal."
    )
    parser.add_argument(
        "mountpoint",
        nargs="?",
        default=".",
        metavar="MOUNTPOINT",
        help="a kvfs mount, or a directory inside it to check only that part (default: .)",
    )
    parser.add_argument("--repair", action="store_true", help="drop the bad copies found")
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"blocks", "copies", "bad": [{"name", "tier", "error"}], "unavailable", "removed", "repaired"}',
    )
    add_progress_option(parser)
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    [(target, client)] = clients_for([args.mountpoint], args.socket)
    res = run_with_progress(client, target, Fsck(name=target.name, repair=args.repair), "fsck", args.progress).to_json()
    rc = CLEAN if not res["bad"] else CORRECTED if args.repair else UNCORRECTED
    if args.json:
        print_json(res)
        return rc
    for b in res["bad"]:
        action = "dropped" if args.repair else "bad"
        print(f"{action}: {target.display(b['name'])} in {b['tier']}: {b['error']}")
    for u in res["unavailable"]:
        print(f"not checked: {target.display(u['name'])} in {u['tier']}: {u['error']}")
    for name in res["removed"]:
        print(f"removed: {target.display(name)}: no good copy was left")
    summary = f"checked {res['copies']} copies of {res['blocks']} blocks: {len(res['bad'])} bad"
    if res["bad"]:
        summary += ", dropped" if args.repair else " (run kvfs fsck --repair to drop them)"
    print(summary)
    return rc
