"""The ``sglang-backend`` row of ``kvfs bench engines``: kvfs's SGLang HiCache backend
against SGLang's own ``HiCacheFile`` on a plain directory, in the same run.

Both run in ``.venvs/sglang`` under SGLang's own code (``sglang_backend_client.py --phase
bench``): a real ``MHATokenToKVPoolHost`` (page-first, bf16), the backend from SGLang's
``StorageBackendFactory``, and the HiCache controller's own page functions --
``_page_set_zero_copy``/``_page_get_zero_copy`` (``batch_set_v1``/``batch_get_v1``) for
kvfs, ``_generic_page_set``/``_generic_page_get`` (``batch_set``/``batch_get`` of flat
pages, then ``set_from_flat_data_page``) for ``HiCacheFile``, which is what SGLang runs
for each. Per round, fresh keys: a set of every page, then a fresh backend instance gets
them into other host-pool indices (the bytes are checked); the best round of each is
kept. Figures: GB/s of sets and gets, kvfs/HiCacheFile (aim >= 1.5 on gets).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bench_native_rows import gbps_rows, versus_plain
from .engine_clients import run_client

__all__ = ["AIM_GET", "bench_sglang_backend", "rows"]

AIM_GET = 1.5
WHAT = "SGLang HiCache: kvfs backend vs HiCacheFile"


def _run(backend: str, d: Path, pages: int, rounds: int, venvs: Path | None) -> dict[str, Any]:
    d.mkdir(parents=True, exist_ok=True)
    shape = ["--layers", "8", "--heads", "8", "--head-dim", "128", "--layout", "page_first"]
    args = ["--backend", backend, "--dir", str(d), "--phase", "bench", "--pages", str(pages), *shape]
    args += ["--offset", str(pages), "--rounds", str(rounds)]
    return run_client("sglang-backend", *args, venvs=venvs, timeout=900)


def bench_sglang_backend(
    plain_root: Path, mountpoint: Path, args: argparse.Namespace, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Run both backends; their figures and kvfs/HiCacheFile ratios (higher is better)."""
    venvs = Path(args.venvs) if args.venvs else None
    pages, rounds = (16 if args.quick else 64), max(3, args.rounds)
    out: dict[str, Any] = {"client": "sglang-backend", "what": WHAT, "baseline": "HiCacheFile on a plain directory"}
    sides = {"plain": ("file", plain_root / "sglang-backend"), "kvfs": ("kvfs", mountpoint)}

    def figures(kind: str) -> dict[str, Any] | str:
        backend, d = sides[kind]
        progress(f"sglang-backend: {backend} on {kind} ({d})")
        r = _run(backend, d, pages, rounds, venvs)
        if not r["ok"]:
            return f"failed: the {backend} backend did not read back every page byte-exact"
        return {"bytes": r["bytes"], "set_s": r["times"]["set_s"], "get_s": r["times"]["get_s"]}

    return versus_plain(out, figures, ("set", "get"))


def rows(c: dict[str, Any]) -> list[list[str]]:
    """Table rows (the columns of ``kvfs bench engines``)."""
    return gbps_rows(c, [("set", "-"), ("get", f">= {AIM_GET}")])
