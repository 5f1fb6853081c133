"""``kvfs pin`` / ``kvfs unpin``: keep blocks where they are, or let them go again."""

from __future__ import annotations

import argparse

from kvfs.errors import ConfigError
from kvfs.protocol import Pin
from kvfs.units import parse_duration

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
    if not parser.prog.endswith("unpin"):
        parser.add_argument(
            "--for",
            dest="ttl",
            default=None,
            metavar="DURATION",
            help='a soft pin: it ends by itself after DURATION ("10m", "2h")',
        )
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    pinned = args.command == "pin"
    ttl = None
    if getattr(args, "ttl", None) is not None:
        try:
            ttl = parse_duration(args.ttl)
        except ValueError as exc:
            raise ConfigError("--for", str(exc)) from None
        if not ttl > 0:
            raise ConfigError("--for", "a soft pin lasts longer than 0s")
    for target, client in clients_for(args.paths, args.socket):
        with about(target):
            res = client.request(Pin(paths=[target.name], pinned=pinned, ttl=ttl or None))
        verb = "pinned" if pinned else "unpinned"
        print(
            f"{verb} {res.blocks} block{'s' if res.blocks != 1 else ''} under {target.display()} ({res.changed} changed)"
        )
    return 0
