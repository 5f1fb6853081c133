"""``kvfs events``: the stream of block events, one line each, as they happen."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from kvfs.protocol import EventItem, Events

from .control_client import Target, add_socket_option, clients_for
from .flags import at_least, positive_int
from .render import format_size
from .scratch import end_on_sigterm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print block events as they happen, one line each: stored, promoted, demoted, evicted, "
        "removed, corrupt, renamed, with the block's name, the tier and the size. Runs until "
        "interrupted (Ctrl-C, SIGTERM), or until --count events were printed."
    )
    parser.add_argument(
        "mountpoint", nargs="?", default=".", metavar="MOUNTPOINT", help="a kvfs mount or a path inside it (default: .)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per line: {"seq", "time", "kind", "name", "tier", "size", "detail", "parent"}',
    )
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N events")
    parser.add_argument(
        "--zmq",
        metavar="ADDR",
        help="publish them instead as vLLM KV events (msgpack over a ZMQ PUB socket bound at ADDR, e.g. "
        "tcp://127.0.0.1:5557) for llm-d's indexer or Dynamo's router; [events] zmq makes the daemon do it",
    )
    parser.add_argument(
        "--block-size", type=at_least(0), default=0, metavar="N", help="with --zmq: the engine's tokens per block"
    )
    add_socket_option(parser)


def _publish(args: argparse.Namespace, target: Target) -> int:
    """``--zmq``: the stream of the mount's events, republished as vLLM KV events."""
    from kvfs.client import Client
    from kvfs.mount.kv_events import KvEventPublisher, Translator, publish_stream, tier_places

    try:
        with Client(target.socket, populate=False) as client:  # it maps no block: no arena pages
            places = tier_places((t.name, t.kind, t.shared) for t in client.welcome.tiers)
            tr = Translator(places, block_size=args.block_size)
            pub = KvEventPublisher(args.zmq)
            try:
                events = client.events()  # subscribed when it returns: say so only then
                print(f"publishing KV events of {target.display('')} on {pub.address}", file=sys.stderr, flush=True)
                publish_stream(itertools.islice(events, args.count) if args.count is not None else events, pub, tr)
            finally:
                pub.close()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, wherever it came: a clean stop
        pass
    return 0


def _line(ev: dict[str, Any], display: Callable[[str], str]) -> str:
    t = time.strftime("%H:%M:%S", time.localtime(ev["time"])) + f".{int(ev['time'] * 1000) % 1000:03d}"
    parts = [t, f"{ev['kind']:<8}", f"{ev['tier'] or '-':<6}", display(ev["name"]), format_size(ev["size"])]
    if ev["detail"]:
        parts.append(f"({ev['detail']})")
    return "  ".join(parts)


def run(args: argparse.Namespace) -> int:
    [(target, client)] = clients_for([args.mountpoint], args.socket)
    end_on_sigterm()  # the --zmq publisher says AllBlocksCleared and closes its socket
    if args.zmq:
        client.close()
        return _publish(args, target)
    seen = 0
    with client:
        for item in client.stream(Events()):
            if not isinstance(item, EventItem):
                continue
            ev = item.event.to_json()
            try:
                print(json.dumps(ev) if args.json else _line(ev, target.display), flush=True)
            except BrokenPipeError:  # `kvfs events | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
                return 0
            seen += 1
            if args.count is not None and seen >= args.count:
                return 0
    return 0
