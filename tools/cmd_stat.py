"""``kvfs stat``: one block's record."""

from __future__ import annotations

import argparse

from kvfs.protocol import Stat, StatResult

from .control_client import about, add_socket_option, clients_for
from .render import format_size, format_time, print_json, yes_no


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Show one block's record: size, checksum, the tiers holding a copy (hottest first), "
        "whether it is pinned, its hit count, when it was created and last read."
    )
    parser.add_argument("path", metavar="PATH", help="a block inside a kvfs mount")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON: name, size, checksum, tiers, pinned, hits, created, accessed (epoch seconds), parent, "
        "pin_expires (epoch seconds of a soft pin's end, or null), path",
    )
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    [(target, client)] = clients_for([args.path], args.socket)
    with about(target):
        st = client.request(Stat(name=target.name), StatResult).to_json()
    st["path"] = target.display()
    if args.json:
        print_json(st)
        return 0
    rows = [
        ("path", st["path"]),
        ("size", f"{format_size(st['size'])} ({st['size']} bytes)"),
        ("checksum", st["checksum"]),
        ("tiers", ", ".join(st["tiers"]) or "-"),
        (
            "pinned",
            yes_no(st["pinned"]) + (f" (until {format_time(st['pin_expires'])})" if st.get("pin_expires") else ""),
        ),
        ("hits", st["hits"]),
        ("created", format_time(st["created"])),
        ("accessed", format_time(st["accessed"])),
    ]
    for key, value in rows:
        print(f"{key + ':':<10}{value}")
    return 0
