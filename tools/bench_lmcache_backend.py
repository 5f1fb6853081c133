"""The ``lmcache-backend`` row of ``kvfs bench engines``: kvfs's LMCache remote storage
plugin (``kvfs.gpu.lmcache_backend.KvfsRemoteConnector``) against LMCache's own fs connector
on a plain directory, in the same run.

Both run in ``.venvs/lmcache`` under LMCache's own ``StorageManager`` and ``RemoteBackend``
(``lmcache_backend_client.py --phase bench``): per round fresh keys, a ``batched_put`` of
every chunk (timed until every chunk is stored), then a second storage manager of the same
process (its own CPU cache, empty of them) gets them from the remote backend, the bytes
checked; the best round of each. The fs connector's reads come from the page cache (its
files were just written). Figures: GB/s of puts and gets, kvfs/fs (aim >= 1.5 on both).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bench_native_rows import gbps_rows, versus_plain
from .engine_clients import run_client

__all__ = ["AIM", "WHAT", "bench_lmcache_backend", "rows"]

AIM = 1.5
WHAT = "LMCache: kvfs plugin vs fs connector"


def bench_lmcache_backend(
    plain_root: Path, mountpoint: Path, args: argparse.Namespace, progress: Callable[[str], None]
) -> dict[str, Any]:
    venvs = Path(args.venvs) if args.venvs else None
    chunks, rounds = (16 if args.quick else 64), max(3, args.rounds)
    out: dict[str, Any] = {
        "client": "lmcache-backend",
        "what": WHAT,
        "baseline": "LMCache's fs connector on a plain directory",
    }
    sides = {"plain": ("fs", plain_root / "lmcache-backend"), "kvfs": ("kvfs", mountpoint)}

    def figures(kind: str) -> dict[str, Any] | str:
        backend, d = sides[kind]
        progress(f"lmcache-backend: {backend} on {kind} ({d})")
        a = [
            "--backend",
            backend,
            "--dir",
            str(d),
            "--phase",
            "bench",
            "--chunks",
            str(chunks),
            "--rounds",
            str(rounds),
        ]
        r = run_client("lmcache-backend", *a, venvs=venvs, timeout=900)
        if r.get("error") or not r.get("ok"):
            return f"failed: the {backend} backend did not read back every chunk byte-exact ({r.get('error')})"
        return {"bytes": r["bytes"], "put_s": r["times"]["put_s"], "get_s": r["times"]["get_s"]}

    return versus_plain(out, figures, ("put", "get"))


def rows(c: dict[str, Any]) -> list[list[str]]:
    """Table rows (the columns of ``kvfs bench engines``)."""
    return gbps_rows(c, [("put", f">= {AIM}"), ("get", f">= {AIM}")])
