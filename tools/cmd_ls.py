"""``kvfs ls``: blocks and directories with their size, tiers, pin, hits and last access."""

from __future__ import annotations

import argparse
from typing import Any

from kvfs.protocol import Ls, LsResult

from .control_client import add_socket_option, replies_for
from .render import format_size, format_time, print_json_each, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List blocks and directories inside a kvfs mount. A directory lists its entries, a "
        "block itself. -l adds each block's size, the tiers holding it (hottest first), pin "
        "state, hit count and last access."
    )
    parser.add_argument(
        "paths", nargs="*", default=["."], metavar="PATH", help="paths inside a kvfs mount (default: .)"
    )
    parser.add_argument(
        "-l", "--long", action="store_true", help="one line per entry with size, tiers, pinned, hits, last access"
    )
    parser.add_argument("--json", action="store_true", help="print JSON (one object per PATH; a list for several)")
    add_socket_option(parser)


def _long(entries: list[dict[str, Any]]) -> str:
    rows = []
    for e in entries:
        if e["type"] == "dir":
            rows.append(["-", "-", "-", "-", "-", e["name"] + "/"])
        else:
            rows.append(
                [
                    format_size(e["size"]),
                    ",".join(e["tiers"]) or "-",
                    "pinned" if e["pinned"] else "-",
                    e["hits"],
                    format_time(e["accessed"]),
                    e["name"],
                ]
            )
    return table(["SIZE", "TIERS", "PIN", "HITS", "ACCESSED", "NAME"], rows, right=(0, 3))


def run(args: argparse.Namespace) -> int:
    results = replies_for(args.paths, args.socket, lambda t: Ls(name=t.name), LsResult)
    if args.json:
        print_json_each(results)
        return 0
    for i, res in enumerate(results):
        if len(results) > 1:
            print(("\n" if i else "") + f"{res['path']}:")
        entries = res["entries"]
        if res["type"] == "block":  # named as a listing of its directory names it
            entries = [{**entries[0], "name": res["path"].rstrip("/").rsplit("/", 1)[-1]}]
        if args.long:
            if entries:
                print(_long(entries))
        else:
            for e in entries:
                print(e["name"] + ("/" if e["type"] == "dir" else ""))
    return 0
