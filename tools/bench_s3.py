"""``kvfs bench s3``: block put/get through kvfs's S3 tier against raw boto3, same run.

For each concurrency (threads), the same objects are written and read twice: through
:class:`kvfs.tiers.s3.S3Tier` (header + payload, metadata, checksum verified on every
read) and with plain ``put_object`` / ``get_object(...)["Body"].read()`` of the very same
keys, bodies and metadata on a client with the same botocore settings. Rounds alternate
kvfs and boto3; the median throughput of each is reported, and the ratio kvfs / boto3 as
the median of the per-round ratios (robust to load that drifts during the run).

Without ``--endpoint-url`` a moto S3 server is started in a subprocess on 127.0.0.1 (so
it does not share the benchmark's GIL); with it, ``--bucket`` names an existing bucket
and credentials come from boto3's usual chain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvfs.blockfile import checksum, encode_header
from kvfs.config import S3Config
from kvfs.names import TierName
from kvfs.units import parse_size

from .flags import positive_int, size
from .render import table
from .scratch import start_moto


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint-url", help="an S3-compatible endpoint (default: start a local moto server)")
    p.add_argument("--bucket", help="bucket to use with --endpoint-url (must exist)")
    p.add_argument("--prefix", default="kvfs-bench", help="key prefix (default: %(default)s)")
    p.add_argument("--block-size", type=size, default="1MiB", help="payload bytes per block (default: %(default)s)")
    p.add_argument("--blocks", type=positive_int, default=32, help="blocks per round (default: %(default)s)")
    p.add_argument("--concurrency", default="1,8", help="comma-separated thread counts (default: %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=3, help="rounds per measurement; the median is reported")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _timed(fn: Callable[[str], object], items: list[str], threads: int) -> float:
    t0 = time.perf_counter()
    if threads == 1:
        for it in items:
            fn(it)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, items))
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    from kvfs.tiers.s3 import S3Tier

    size = parse_size(args.block_size)
    levels = [int(x) for x in args.concurrency.split(",") if x]
    proc = None
    if args.endpoint_url:
        if not args.bucket:
            print("kvfs bench s3: --bucket is required with --endpoint-url", file=sys.stderr)
            return 2
        endpoint, bucket = args.endpoint_url, args.bucket
    else:
        for k, v in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            os.environ.setdefault(k, v)
        proc, endpoint = start_moto()
        bucket = f"kvfs-bench-{uuid.uuid4().hex[:8]}"
    try:
        cfg = S3Config(
            name=TierName("s3"),
            capacity=None,
            bucket=bucket,
            prefix=f"{args.prefix}/{uuid.uuid4().hex[:8]}",
            endpoint_url=endpoint,
            region=os.environ.get("AWS_DEFAULT_REGION"),
            concurrency=max(levels),
        )
        tier = S3Tier(cfg)
        # the raw client: a separate client built the same way, so only kvfs's work differs
        raw = S3Tier(cfg).client
        if proc is not None:
            raw.create_bucket(Bucket=bucket)
        payload = os.urandom(size)
        csum = checksum(payload)
        names = [f"bench/{i:02x}/blk{i}" for i in range(args.blocks)]
        # what S3Tier.put sends, prebuilt for raw boto3 (the same object under the same key)
        bodies = {n: encode_header(n, size, csum) + payload for n in names}
        meta = {"kvfs-length": str(size), "kvfs-checksum": f"{csum:016x}"}

        ops: dict[str, tuple[Callable[[str], object], Callable[[str], object]]] = {
            "put": (
                lambda n: tier.put(n, payload, csum),
                lambda n: raw.put_object(Bucket=bucket, Key=tier.key(n), Body=bodies[n], Metadata=meta),
            ),
            "get": (
                lambda n: tier.open(n).release(),
                lambda n: raw.get_object(Bucket=bucket, Key=tier.key(n))["Body"].read(),
            ),
        }
        rows = []
        for threads in levels:
            for op, (kv_fn, raw_fn) in ops.items():
                kv_fn(names[0]), raw_fn(names[0])  # warm connections
                kv_t: list[float] = []
                raw_t: list[float] = []
                for r in range(args.rounds):
                    order = [(kv_fn, kv_t), (raw_fn, raw_t)]
                    for fn, out in order if r % 2 == 0 else reversed(order):
                        out.append(_timed(fn, names, threads))
                mb = size * len(names) / 1e6
                kv, rw = mb / statistics.median(kv_t), mb / statistics.median(raw_t)
                # the ratio is the median of per-round ratios: each round's kvfs and boto3
                # runs are back to back, so load that drifts over the run cancels out
                ratio = statistics.median(r / k for k, r in zip(kv_t, raw_t))
                rows.append(
                    {
                        "op": op,
                        "threads": threads,
                        "block_bytes": size,
                        "blocks": len(names),
                        "kvfs_MBps": round(kv, 1),
                        "boto3_MBps": round(rw, 1),
                        "ratio": round(ratio, 3),
                    }
                )
        for n in names:
            tier.delete(n)
        tier.close()
        raw.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    if args.json:
        print(json.dumps({"endpoint": "moto (local)" if proc else endpoint, "results": rows}, indent=2))
    else:
        print(
            f"kvfs bench s3: {size} B blocks x {args.blocks}, median of {args.rounds} rounds, "
            f"endpoint {'moto on 127.0.0.1' if proc else endpoint}"
        )
        print(
            table(
                ["op", "threads", "kvfs MB/s", "boto3 MB/s", "kvfs/boto3"],
                [
                    [r["op"], r["threads"], f"{r['kvfs_MBps']:.1f}", f"{r['boto3_MBps']:.1f}", f"{r['ratio']:.3f}"]
                    for r in rows
                ],
            )
        )
    return 0
