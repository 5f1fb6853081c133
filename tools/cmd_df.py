"""``kvfs df``: each tier's capacity, use and health, and each namespace's use against its quotas."""

from __future__ import annotations

import argparse

from kvfs.protocol import Df, DfResult

from .cmd_quota import render as render_namespaces
from .control_client import add_socket_option, clients_for
from .render import format_size, print_json, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Show where the mount's config came from (a file, or the embedded default and how its "
        "sizes were chosen), each tier of the mount (hottest first): capacity, bytes used and free, "
        "blocks held and health (a tier that fails or hangs is marked unhealthy and skipped); on a "
        "cluster node each peer: health, blocks it is known to hold, blocks and bytes read "
        "from it, blocks it read from this node, reads given up with every landing buffer busy; "
        "then each namespace's use against its quotas (as kvfs quota show)."
    )
    parser.add_argument(
        "mountpoint",
        nargs="?",
        default=".",
        metavar="MOUNTPOINT",
        help="a kvfs mount (or any path inside it; default: .)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"mountpoint", "config", "blocks", "tiers": [{"name", "kind", "capacity", "used", "free", '
        '"blocks", "healthy", "persistent", "shared"}], "peers": [{"name", "healthy", "blocks", "hits", '
        '"bytes_read", "served", "busy"}], "namespaces": [as kvfs quota show --json]}',
    )
    add_socket_option(parser)


def run(args: argparse.Namespace) -> int:
    [(target, client)] = clients_for([args.mountpoint], args.socket)
    st = client.request(Df(), DfResult).to_json()
    tiers = []
    for t in st["tiers"]:
        cap = t["capacity"]
        tiers.append(
            {
                "name": t["name"],
                "kind": t["kind"],
                "capacity": cap,
                "used": t["used"],
                "free": None if cap is None else max(cap - t["used"], 0),
                "blocks": t["blocks"],
                "healthy": t["healthy"],
                "persistent": t["persistent"],
                "shared": t["shared"],
            }
        )
    mountpoint = st.get("mountpoint") if target.mountpoint is None else target.mountpoint
    spaces = st.get("namespaces", [])
    config = st.get("config", "")
    peers = [
        {k: p[k] for k in ("name", "healthy", "blocks", "hits", "bytes_read", "served", "busy")}
        for p in st.get("peers", [])
    ]
    if args.json:
        print_json(
            {
                "mountpoint": mountpoint,
                "config": config,
                "blocks": st["blocks"],
                "tiers": tiers,
                "peers": peers,
                "namespaces": spaces,
            }
        )
        return 0
    rows = []
    for t in tiers:
        cap = t["capacity"]
        rows.append(
            [
                t["name"],
                t["kind"],
                "unlimited" if cap is None else format_size(cap),
                format_size(t["used"]),
                "-" if cap is None else format_size(t["free"]),
                "-" if not cap else f"{100 * t['used'] / cap:.0f}%",
                t["blocks"],
                "ok" if t["healthy"] else "UNHEALTHY",
            ]
        )
    print(f"{mountpoint}: {st['blocks']} block{'' if st['blocks'] == 1 else 's'}")
    if config:
        print(f"config: {config}")
    print(table(["TIER", "KIND", "CAPACITY", "USED", "FREE", "USE%", "BLOCKS", "HEALTH"], rows, right=(2, 3, 4, 5, 6)))
    if peers:
        rows = [
            [
                p["name"],
                "ok" if p["healthy"] else "UNHEALTHY",
                p["blocks"],
                p["hits"],
                format_size(p["bytes_read"]),
                p["served"],
                p["busy"],
            ]
            for p in peers
        ]
        print()
        print(table(["PEER", "HEALTH", "BLOCKS", "READ", "READ BYTES", "SERVED", "BUSY"], rows, right=(2, 3, 4, 5, 6)))
    if spaces:
        print()
        print(render_namespaces(spaces, target.display))
    return 0
