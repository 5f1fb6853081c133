"""``kvfs bench tiers``: block put/get through the store, per tier, against the raw
operation on the same bytes in the same run, plus the catalog's memory and lookup cost.

Baselines: DRAM put/get against a numpy memcpy of the same block; disk put/get against
``os.pwrite``/``os.preadv`` of the same bytes to files in the same directory (open, I/O,
close per block; page cache warm on reads, as the store's reads are).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvfs.catalog import BlockRecord, Catalog
from kvfs.config import DiskConfig, DramConfig
from kvfs.names import TierName
from kvfs.policies import DEFAULT_POLICY, make_policy
from kvfs.store import Store
from kvfs.units import format_size, parse_size

from .flags import positive_int, size
from .render import table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-size", type=size, default="2MiB", help="block size (default 2MiB)")
    p.add_argument("--blocks", type=positive_int, default=64, help="blocks per pass (default 64)")
    p.add_argument("--passes", type=positive_int, default=5, help="passes; the best is reported (default 5)")
    p.add_argument(
        "--dir", type=Path, default=None, help="directory for the disk tier (default: a temp dir under /var/tmp)"
    )
    p.add_argument(
        "--catalog-blocks",
        type=positive_int,
        default=1_000_000,
        help="blocks in the catalog for the memory/lookup figures",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def best_of(fn: Callable[[], object], passes: int) -> float:
    """Seconds of the fastest of *passes* runs of *fn* (the least disturbed by the neighbours)."""
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _store_figures(store: Store, blocks: list[np.ndarray], passes: int) -> tuple[float, float]:
    names = [f"bench/{i:02x}/{i}" for i in range(len(blocks))]
    out = np.empty_like(blocks[0])

    def put() -> None:
        for n, b in zip(names, blocks):
            store.put(n, b)

    def get() -> None:
        for n in names:
            store.read_into(n, out)

    put_s = best_of(put, passes)
    get_s = best_of(get, passes)
    for n, b in zip(names[:4], blocks):
        store.read_into(n, out)
        assert np.array_equal(out, b), "read back the wrong bytes"
    return put_s, get_s


def _memcpy(blocks: list[np.ndarray], passes: int) -> tuple[float, float]:
    """Copy every block into an arena (what a put does) and out of it into one buffer
    (what a get does): the memory-bandwidth baselines for the DRAM tier."""
    arena = np.empty(sum(b.nbytes for b in blocks), dtype=np.uint8)
    views = [arena[i * blocks[0].nbytes : (i + 1) * blocks[0].nbytes] for i in range(len(blocks))]
    out = np.empty_like(blocks[0])

    def copy_in() -> None:
        for v, b in zip(views, blocks):
            np.copyto(v, b)

    def copy_out() -> None:
        for v in views:
            np.copyto(out, v)

    return best_of(copy_in, passes), best_of(copy_out, passes)


def _raw_file(directory: Path, blocks: list[np.ndarray], passes: int) -> tuple[float, float]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [str(directory / f"raw{i}") for i in range(len(blocks))]
    out = np.empty_like(blocks[0])

    def put() -> None:
        for p, b in zip(paths, blocks):
            fd = os.open(p + ".tmp", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            os.pwrite(fd, b, 0)  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer from Python 3.12 only
            os.close(fd)
            os.rename(p + ".tmp", p)

    def get() -> None:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            os.preadv(fd, [out], 0)  # type: ignore[list-item]  # numpy stubs: ndarray is a Buffer from Python 3.12 only
            os.close(fd)

    return best_of(put, passes), best_of(get, passes)


def catalog_figures(n: int) -> dict[str, Any]:
    """Bytes per block of the catalog plus one policy entry, and the cost of a lookup."""
    gc.collect()
    tracemalloc.start()
    cat = Catalog(2)
    pol = make_policy(DEFAULT_POLICY)
    names = []
    for i in range(n):
        h = random.Random(i).getrandbits(128).to_bytes(16, "big").hex()
        name = f"llama-3-8b-0123456789ab/{h[:2]}/{h}"
        rec = BlockRecord(name, 2 << 20, i, tiers=1, created=0.0, accessed=0.0)
        cat.add(rec)
        pol.insert(rec, 2 << 20)
        names.append(name)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    names_bytes = sum(sys.getsizeof(s) for s in names)  # the names exist anyway
    per_block = (current - names_bytes - sys.getsizeof(names)) / n
    probe = random.Random(1).sample(names, min(100_000, n))
    t0 = time.perf_counter()
    for name in probe:
        cat.get(name)
    lookup = (time.perf_counter() - t0) / len(probe)
    t0 = time.perf_counter()
    for name in probe[:20_000]:
        pol.touch(cat.get(name))
    touch = (time.perf_counter() - t0) / min(len(probe), 20_000)
    return {
        "blocks": n,
        "bytes_per_block": round(per_block + 0.0, 1),
        "name_bytes_per_block": names_bytes / n,
        "lookup_us": lookup * 1e6,
        "lookup_and_touch_us": touch * 1e6,
    }


def run(args: argparse.Namespace) -> int:
    size = parse_size(args.block_size)
    rng = np.random.default_rng(0)
    blocks = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(args.blocks)]
    total: int = size * args.blocks
    base = args.dir or Path(tempfile.mkdtemp(prefix="kvfs-bench-", dir="/var/tmp"))
    rows = []

    def gbps(seconds: float) -> float:
        return total / seconds / 1e9

    print(
        f"kvfs bench tiers: {args.blocks} blocks of {format_size(size)}, best of {args.passes} passes", file=sys.stderr
    )
    try:
        memcpy_in, memcpy_out = (gbps(x) for x in _memcpy(blocks, args.passes))
        from kvfs.tiers.dram import DramTier

        dram = DramTier(DramConfig(name=TierName("dram"), capacity=total + (64 << 20)))
        with _closing(Store([dram], rebuild=False)) as s:
            put, get = (gbps(x) for x in _store_figures(s, blocks, args.passes))
        rows.append(
            {
                "tier": "dram",
                "op": "put",
                "GB/s": put,
                "baseline": "memcpy in",
                "baseline GB/s": memcpy_in,
                "ratio": put / memcpy_in,
            }
        )
        rows.append(
            {
                "tier": "dram",
                "op": "get",
                "GB/s": get,
                "baseline": "memcpy out",
                "baseline GB/s": memcpy_out,
                "ratio": get / memcpy_out,
            }
        )
        print("  dram done", file=sys.stderr)

        raw_put, raw_get = (gbps(x) for x in _raw_file(base / "raw", blocks, args.passes))
        from kvfs.tiers.disk import DiskTier

        for label, direct in (("disk", False), ("disk (O_DIRECT)", True)):
            d = base / ("direct" if direct else "buffered")
            tier = DiskTier(
                DiskConfig(name=TierName("disk"), capacity=2 * total + (64 << 20), path=d, direct_io=direct)
            )
            with _closing(Store([tier], rebuild=False)) as s:
                put, get = (gbps(x) for x in _store_figures(s, blocks, args.passes))
            rows.append(
                {
                    "tier": label,
                    "op": "put",
                    "GB/s": put,
                    "baseline": "os.pwrite",
                    "baseline GB/s": raw_put,
                    "ratio": put / raw_put,
                }
            )
            rows.append(
                {
                    "tier": label,
                    "op": "get",
                    "GB/s": get,
                    "baseline": "os.preadv",
                    "baseline GB/s": raw_get,
                    "ratio": get / raw_get,
                }
            )
            print(f"  {label} done", file=sys.stderr)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"  catalog with {args.catalog_blocks:,} blocks…", file=sys.stderr)
    cat = catalog_figures(args.catalog_blocks)
    if args.json:
        print(json.dumps({"block_size": size, "blocks": args.blocks, "throughput": rows, "catalog": cat}, indent=2))
        return 0
    print(
        table(
            ["tier", "op", "GB/s", "baseline", "baseline GB/s", "ratio"],
            [
                [
                    r["tier"],
                    r["op"],
                    f"{r['GB/s']:.2f}",
                    r["baseline"],
                    f"{r['baseline GB/s']:.2f}",
                    f"{r['ratio']:.2f}",
                ]
                for r in rows
            ],
        )
    )
    print()
    print(
        table(
            ["catalog blocks", "bytes/block (catalog+policy)", "name bytes/block", "lookup", "lookup+touch"],
            [
                [
                    f"{cat['blocks']:,}",
                    f"{cat['bytes_per_block']:.0f}",
                    f"{cat['name_bytes_per_block']:.0f}",
                    f"{cat['lookup_us']:.2f} µs",
                    f"{cat['lookup_and_touch_us']:.2f} µs",
                ]
            ],
        )
    )
    return 0


class _closing:
    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> Store:
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()
