"""A KV-events subscriber for the tests, run as a real (possibly other) user.

``python zmq_peer.py ADDR UID GID STOP_HEX TIMEOUT``: drops to *UID*/*GID* (it starts as
root with the tests' interpreter, which other users may not be able to start), subscribes
to every topic at *ADDR*, prints ``LIVE`` at its first message, and collects every event
until a ``BlockStored`` of *STOP_HEX* arrives or *TIMEOUT* seconds pass; then prints one
JSON line: ``{"events": [[type, hex or null], ...], "stopped": bool}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import msgpack
import zmq


def main() -> None:
    addr, uid, gid, stop, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(addr)
    print("READY", flush=True)
    events: list[list] = []
    live = False
    stopped = False
    deadline = time.monotonic() + timeout
    while not stopped and time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        _topic, _seq, payload = sock.recv_multipart()
        if not live:
            live = True
            print("LIVE", flush=True)
        _ts, batch = msgpack.unpackb(payload, raw=False)
        for ev in batch:
            hashes = ev.get("block_hashes") or [None]
            for h in hashes:
                hx = h.hex() if isinstance(h, bytes) else None
                events.append([ev["type"], hx])
                stopped = stopped or (ev["type"] == "BlockStored" and hx == stop)
    print(json.dumps({"events": events, "stopped": stopped}), flush=True)


if __name__ == "__main__":
    main()
