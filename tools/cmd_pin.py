"""``kvfs pin`` / ``kvfs unpin``: keep blocks where they are, or let them go again."""

from __future__ import annotations

import argparse

from kvfs.protocol import Pin

from .control_client import about, add_socket_option, clients_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if parser.prog.endswith("unpin"):
        parser.description = (
            "Unpin blocks: they become eviction candidates again. A directory unpins everything under it."
        )
    else:
        parser.description = (
            "Pin blocks: a pinned block stays in the hottest tier it is in and is never evicted "
            "(writes fail with ENOSPC when a tier is all pinned). A directory pins every block under it."
        )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="blocks or directories inside a kvfs mount")
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    pinned = args.command == "pin"
    for target, client in clients_for(args.paths, args.socket):
        with about(target):
            res = client.request(Pin(paths=[target.name], pinned=pinned))
        verb = "pinned" if pinned else "unpinned"
        print(
            f"{verb} {res.blocks} block{'s' if res.blocks != 1 else ''} under {target.display()} ({res.changed} changed)"
        )
    return 0
