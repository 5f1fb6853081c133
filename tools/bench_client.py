"""``kvfs bench client``: the batch client against the raw operation on the same bytes in
the same run, and the same blocks through the FUSE path.

It mounts kvfs (a DRAM tier over a disk tier, in a temporary directory), then measures,
best of ``--passes``:

- **put / get from DRAM** (2 MiB blocks, ``--batch`` per round trip): ``Client.put`` (bytes
  copied straight into reserved arena extents, checksummed, committed) and
  ``Client.get_into`` (copied out of the arena under leases) against ``memcpy`` of the same
  bytes between the same buffers (numpy ``copyto``);
- **put / get through a copy buffer** (``Client(copy=True)``: the path of a peer that a
  namespace's access rule keeps off the arena): the same blocks, the daemon copying each
  between the session's buffer and the arena, against the same memcpy;
- **get from disk, direct**: the blocks evicted to the disk tier, ``get_into`` with
  ``promote="never"`` (the client ``preadv``s each block file at its payload offset and
  verifies xxh3-64) against raw ``os.preadv`` of the same files plus the same checksum;
  page cache warm for both;
- **lookup** of ``--names`` names (1,000) in one call, against ``os.stat`` of each
  through the mount (what a program without the client does);
- **put / get through FUSE**: the same blocks written and read as files on the mount,
  against the same memcpy.

Every figure is a ratio against its baseline measured in the same run (``ratio``:
client / baseline for throughput, baseline / client for lookup time: above 1 is faster).
The load average is printed with them: the figures of a shared machine move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvfs.blockfile import read_header
from kvfs.units import format_size, parse_size

from .bench_tiers import best_of
from .flags import positive_int, size
from .render import table

__all__ = ["add_arguments", "random_blocks", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-size", type=size, default="2MiB", help="block size (default 2MiB)")
    p.add_argument("--blocks", type=positive_int, default=64, help="blocks per pass (default 64)")
    p.add_argument("--batch", type=positive_int, default=32, help="blocks per client call (default 32)")
    p.add_argument("--passes", type=positive_int, default=5, help="passes; the best is reported (default 5)")
    p.add_argument("--names", type=positive_int, default=1000, help="names per lookup (default 1000)")
    p.add_argument("--dir", type=Path, default=None, help="where to mount (default: a temp dir under /var/tmp)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _memcpy(blocks: list[np.ndarray], outs: list[np.ndarray], passes: int) -> tuple[float, float]:
    """Seconds to copy every block into a buffer of its own (what a put does) and out of
    those into *outs* (what a get does): memcpy of the same bytes, the baseline."""
    dest = [np.empty_like(b) for b in blocks]
    copy_in = best_of(lambda: [np.copyto(d, b) for d, b in zip(dest, blocks)], passes)  # type: ignore[func-returns-value]  # a list of Nones, unread
    copy_out = best_of(lambda: [np.copyto(o, d) for o, d in zip(outs, dest)], passes)  # type: ignore[func-returns-value]  # a list of Nones, unread
    return copy_in, copy_out


def random_blocks(size: int, n: int) -> tuple[list[np.ndarray], list[str]]:
    """*n* blocks of *size* random bytes (seeded: the same in every run) and their names."""
    rng = np.random.default_rng(0)
    blocks = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
    return blocks, [f"bench/{i % 256:02x}/{i:032x}" for i in range(n)]


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _row(path: str, op: str, seconds: float, base: str, base_seconds: float, nbytes: int) -> dict[str, Any]:
    gb_s, base_gb_s = nbytes / seconds / 1e9, nbytes / base_seconds / 1e9
    return {
        "path": path,
        "op": op,
        "gb_s": gb_s,
        "baseline": base,
        "baseline_gb_s": base_gb_s,
        "ratio": gb_s / base_gb_s,
    }


def _payload_offset(path: str) -> int:
    """Where the block file *path*'s payload starts (0 when its header is an attribute
    beside it, docs/block-format.md)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_header(fd).header_length
    finally:
        os.close(fd)


def raw_preadv(
    files: list[tuple[str, int, int]], outs: list[np.ndarray], csums: list[int] | None = None, *, bench: str
) -> None:
    """The baseline of a direct read: ``preadv`` of each ``(path, offset, length)`` into
    the matching buffer of *outs*, each verified against *csums* (xxh3-64) when given."""
    for k, ((path, off, n), o) in enumerate(zip(files, outs, strict=True)):
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.preadv(fd, [o[:n]], off) != n:  # type: ignore[list-item]  # numpy stubs: ndarray is a Buffer from Python 3.12 only
                raise SystemExit(f"kvfs: bench {bench}: short read of {path}")
        finally:
            os.close(fd)
        if csums is not None and xxhash.xxh3_64_intdigest(o[:n]) != csums[k]:  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer from Python 3.12 only
            raise SystemExit(f"kvfs: bench {bench}: {path} does not verify")


def run(args: argparse.Namespace) -> int:
    from kvfs.client import Client

    from .scratch import dram_disk_config, mount, progress, umount

    size = parse_size(args.block_size)
    n = args.blocks
    total = size * n
    say = progress(args.json)
    blocks, names = random_blocks(size, n)
    outs = [np.empty(size, dtype=np.uint8) for _ in range(n)]
    base = args.dir or Path(tempfile.mkdtemp(prefix="kvfs-bench-client-", dir="/var/tmp"))
    dram = max(2 * total + (64 << 20), 2 * args.batch * size + (64 << 20))
    client = f"[client]\nmax_reserved = {dram // 2}\ncopy_buffer = {dram // 2}\n"
    cfg = dram_disk_config(base, dram, 4 * total + (256 << 20), "kvfs.toml", lean=False, extra=client)
    mp = base / "mnt"
    load_before = os.getloadavg()
    say(f"kvfs bench client: {n} blocks of {format_size(size)}, {args.batch} per call, best of {args.passes} passes")
    mount(mp, cfg)
    rows: list[dict[str, Any]] = []
    try:
        with Client(mp, write=True, name="kvfs bench client") as c:
            copy_in, copy_out = _memcpy(blocks, outs, args.passes)
            batches = _chunks(n, args.batch)

            def get(promote: str | None = None) -> None:
                for s in batches:
                    c.get_into(names[s], outs[s], promote=promote)

            def put_get(client: Client, path: str) -> None:
                """Rows for puts and gets of every block through *client*; the bytes checked."""

                def put() -> None:
                    for s in batches:
                        client.put(names[s], blocks[s])

                def get_all() -> None:
                    for s in batches:
                        client.get_into(names[s], outs[s])

                for o in outs:
                    o.fill(0)
                rows.append(_row(path, "put", best_of(put, args.passes), "memcpy", copy_in, total))
                rows.append(_row(path, "get", best_of(get_all, args.passes), "memcpy", copy_out, total))
                for o, b in zip(outs, blocks):
                    if not np.array_equal(o, b):
                        raise SystemExit(f"kvfs: bench client: {path} read back the wrong bytes")
                say(f"  {path} put/get done")

            put_get(c, "client")
            # -- the copy path: what a peer a namespace's rule keeps off the arena gets
            with Client(mp, write=True, copy=True, name="kvfs bench client, copy path") as cc:
                put_get(cc, "client copy")

            # -- disk, direct: the block files themselves
            c.evict(names, tier="dram")
            files = [str(base / "disk" / "blocks" / nm) for nm in names]
            extents = [(f, _payload_offset(f), size) for f in files]
            csums = [c.stat(nm).checksum for nm in names]
            raw_s = best_of(lambda: raw_preadv(extents, outs, csums, bench="client"), args.passes)
            disk_s = best_of(lambda: get("never"), args.passes)
            if any("dram" in c.stat(nm).tiers for nm in names):
                raise SystemExit("kvfs: bench client: a direct read promoted a block")
            rows.append(_row("client", "get (disk, direct)", disk_s, "preadv + xxh3", raw_s, total))
            say("  disk direct get done")

            # -- lookup of many names, one call, against os.stat of each through FUSE
            lnames = [f"look/{i % 256:02x}/{i:032x}" for i in range(args.names)]
            c.put(lnames, [b"x"] * len(lnames))
            reps = max(10, args.passes * 4)
            found = c.lookup(lnames)
            if found.prefix != len(lnames):
                raise SystemExit("kvfs: bench client: lookup missed names it should have found")
            look_s = best_of(lambda: c.lookup(lnames), reps)
            stat_s = best_of(lambda: [os.stat(mp / nm) for nm in lnames], max(3, args.passes))
            rows.append(
                {
                    "path": "client",
                    "op": f"lookup {len(lnames)} names",
                    "gb_s": None,
                    "ms": look_s * 1e3,
                    "baseline": "os.stat via FUSE",
                    "baseline_gb_s": None,
                    "baseline_ms": stat_s * 1e3,
                    "ratio": stat_s / look_s,
                }
            )
            say("  lookup done")

        # -- the same blocks through the FUSE path
        fnames = [mp / "fuse" / f"{i:032x}" for i in range(n)]
        (mp / "fuse").mkdir(exist_ok=True)

        def fuse_put() -> None:
            for p, b in zip(fnames, blocks):
                with open(p, "wb") as f:
                    f.write(b)  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer from Python 3.12 only

        def fuse_get() -> None:
            for p, o in zip(fnames, outs):
                with open(p, "rb", buffering=0) as f:
                    f.readinto(o)  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer from Python 3.12 only

        rows.append(_row("fuse", "put", best_of(fuse_put, args.passes), "memcpy", copy_in, total))
        rows.append(_row("fuse", "get", best_of(fuse_get, args.passes), "memcpy", copy_out, total))
        say("  fuse put/get done")
    finally:
        umount(mp)
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    load: dict[str, Any] = {"before": load_before, "after": os.getloadavg(), "cpus": os.cpu_count()}
    if args.json:
        print(
            json.dumps({"block_size": size, "blocks": n, "batch": args.batch, "load": load, "results": rows}, indent=2)
        )
        return 0
    print(
        table(
            ["path", "op", "GB/s", "baseline", "baseline GB/s", "ratio"],
            [
                [
                    r["path"],
                    r["op"],
                    f"{r['gb_s']:.2f}" if r["gb_s"] is not None else f"{r['ms']:.3f} ms",
                    r["baseline"],
                    f"{r['baseline_gb_s']:.2f}" if r["baseline_gb_s"] is not None else f"{r['baseline_ms']:.3f} ms",
                    f"{r['ratio']:.2f}",
                ]
                for r in rows
            ],
        )
    )
    print(
        f"\nload average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after, on {load['cpus']} CPUs; "
        "ratios are client/baseline (lookup: baseline/client)"
    )
    return 0
