"""The ``vllm-tier`` row of ``kvfs bench engines``: kvfs's secondary tier of vLLM's tiered
offloading (``kvfs.gpu.vllm_tier.KvfsTier``) against vLLM's own ``fs`` tier on a plain
directory, in the same run.

Both run in ``.venvs/vllm`` under vLLM's own classes (``vllm_tier_client.py``): a real
``TieringOffloadingSpec``/``TieringOffloadingManager`` over vLLM's CPU primary tier, the
tier made by ``SecondaryTierFactory``. Per round, fresh directories: a process stores every
chunk (``prepare_store``, the rows filled, ``complete_store`` cascading to the tier, until
its jobs finished) and a second process (an empty primary tier) looks every chunk up and
promotes it (until every lookup is a hit), the bytes checked. vLLM's fs tier uses
``O_DIRECT`` on the plain directory (reads come from the device, not the page cache);
kvfs serves from its DRAM tier. Figures: GB/s of stores and loads, kvfs/fs (aim >= 2 on
both); the best round of each.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bench_native_rows import gbps_rows, versus_plain
from .engine_clients import run_client

__all__ = ["AIM", "WHAT", "bench_vllm_tier", "rows"]

AIM = 2.0
WHAT = "vLLM tiered offloading: kvfs tier vs fs tier"


def _phase(tier: str, d: Path, phase: str, blocks: int, venvs: Path | None) -> dict[str, Any]:
    args = ["--tier", tier, "--dir", str(d), "--phase", phase, "--blocks", str(blocks), "--block-kib", "1024"]
    return run_client("vllm-tier", *args, venvs=venvs, timeout=900)


def bench_vllm_tier(
    plain_root: Path, mountpoint: Path, args: argparse.Namespace, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Both tiers, ``max(2, --rounds)`` rounds each; figures and kvfs/fs ratios."""
    venvs = Path(args.venvs) if args.venvs else None
    blocks = 32 if args.quick else 128
    out: dict[str, Any] = {
        "client": "vllm-tier",
        "what": WHAT,
        "baseline": "vLLM's fs tier on a plain directory (O_DIRECT)",
    }
    sides = {"plain": ("fs", plain_root / "vllm-tier"), "kvfs": ("kvfs", mountpoint)}

    def figures(kind: str) -> dict[str, Any] | str:
        tier, root = sides[kind]
        best: dict[str, Any] = {}
        for r in range(max(2, args.rounds)):
            d = root / f"round-{r}" if tier == "fs" else root
            if tier == "kvfs":
                shutil.rmtree(root / "vllm-tier", ignore_errors=True)  # a cold tier each round
            progress(f"vllm-tier: {tier} tier on {kind} ({d}), round {r + 1}")
            store = _phase(tier, d, "store", blocks, venvs)
            load = _phase(tier, d, "load", blocks, venvs)
            if not store["store"]["cascaded"] or load["load"]["equal"] != [True] * blocks:
                return f"failed: the {tier} tier did not load every chunk back byte-exact"
            fig = {
                "bytes": blocks * 1024 * 1024,
                "store_s": store["times"]["store_s"],
                "load_s": load["times"]["load_s"],
            }
            best = fig if not best else {k: min(best[k], fig[k]) if k != "bytes" else fig[k] for k in fig}
        return best

    return versus_plain(out, figures, ("store", "load"))


def rows(c: dict[str, Any]) -> list[list[str]]:
    """Table rows (the columns of ``kvfs bench engines``)."""
    return gbps_rows(c, [("store", f">= {AIM}"), ("load", f">= {AIM}")])
