"""A KV-events subscriber as a router runs it, decoding with vLLM's own classes.

Run inside the vLLM virtualenv, by path: ``--connect ADDR``: a ZMQ SUB socket connected to
*ADDR* (all topics); prints ``READY`` once subscribed, then decodes every message
``(topic, seq, payload)`` with ``msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch)``
-- strictly typed: a field of the wrong type fails the decode -- until an
``AllBlocksCleared`` arrives after at least one ``BlockStored`` (the publisher stopping),
or with ``--until-removed HEX`` a ``BlockRemoved`` of that hash, or ``--timeout`` seconds pass.

The result: per message its topic, seq and events (type, hashes as hex, parent, medium,
locality, block_size, token_ids), and any message that did not decode.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from client_report import emit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--until-removed", metavar="HEX", help="stop at the BlockRemoved of this hash")
    args = parser.parse_args()

    import msgspec
    import zmq
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(args.connect)
    time.sleep(0.5)  # the subscription reaches the publisher (ZMQ's slow joiner)
    print("READY", flush=True)

    def hx(h: object) -> object:
        return h.hex() if isinstance(h, bytes) else h

    messages, errors, stored = [], [], 0
    deadline = time.monotonic() + args.timeout
    done = False
    while not done and time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        topic, seq, payload = sock.recv_multipart()
        try:
            batch = decoder.decode(payload)
        except msgspec.DecodeError as exc:
            errors.append(str(exc))
            continue
        events = []
        for ev in batch.events:
            rec: dict[str, Any] = {"type": type(ev).__name__}
            if isinstance(ev, BlockStored):
                stored += 1
                rec.update(
                    hashes=[hx(h) for h in ev.block_hashes],
                    parent=hx(ev.parent_block_hash),
                    medium=ev.medium,
                    locality=ev.locality,
                    block_size=ev.block_size,
                    token_ids=ev.token_ids,
                )
            elif isinstance(ev, BlockRemoved):
                rec.update(hashes=[hx(h) for h in ev.block_hashes], medium=ev.medium, locality=ev.locality)
                done = done or args.until_removed in rec["hashes"]
            elif isinstance(ev, AllBlocksCleared) and stored and not args.until_removed:
                done = True
            events.append(rec)
        messages.append({"topic": topic.decode(), "seq": int.from_bytes(seq, "big"), "events": events})
    emit({"messages": messages, "errors": errors, "finished": done})


if __name__ == "__main__":
    main()
