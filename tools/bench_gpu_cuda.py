"""The GPU rows of ``kvfs bench gpu`` (see :mod:`kvfs.tools.bench_gpu`): pinned H2D from
the arena, GDS reads into HBM by the agent's loaders vs raw kvikio, HBM hit latency and
warm TTFT from each tier. Each row that cannot run here says why.

Written without a GPU at hand (none was available when it was written): every path is
the agent's own code, and every figure is checked for the right bytes before it counts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .bench_client import _chunks
from .bench_client import _row as _rate
from .bench_gpu import GPU_ROWS, _latency, _skipped, paired

__all__ = ["cuda_rows"]


def cuda_rows(
    c: Any, mp: Path, names: list[str], blocks: list[np.ndarray], args: argparse.Namespace, say: Callable[[str], None]
) -> list[dict[str, Any]]:

    import torch

    from kvfs.gpu.transfer import cuda_missing

    why = "device is cpu (run with --device cuda)" if not str(args.device).startswith("cuda") else cuda_missing()
    if why:
        return [_skipped(p, op, base, f"skipped: {why}") for p, op, base in GPU_ROWS]
    device = torch.device(args.device)
    rows: list[dict[str, Any]] = []
    rows += _h2d(c, names, blocks, args, device)
    say("  pinned H2D done")
    rows += _gds(c, names, blocks, args, device)
    say("  GDS reads done")
    rows += _hit(c, names, args, device)
    say("  HBM hits done")
    rows += _ttft(mp, args, device, say)
    return rows


def _check(dests: list[Any], blocks: list[np.ndarray], what: str) -> None:
    for d, b in zip(dests, blocks, strict=False):
        if d[: len(b)].cpu().numpy().tobytes() != b.tobytes():
            raise SystemExit(f"kvfs: bench gpu: {what} moved the wrong bytes")


def _h2d(
    c: Any, names: list[str], blocks: list[np.ndarray], args: argparse.Namespace, device: Any
) -> list[dict[str, Any]]:
    import torch

    from kvfs.gpu.transfer import ArenaCopier

    size, total = len(blocks[0]), len(blocks[0]) * len(blocks)
    c.prefetch(names, tier="dram")
    holds = c.lease(names, promote="always")
    copier = ArenaCopier(c.arena, device, writable=c.writable)
    stream = torch.cuda.Stream(device)
    dests = [torch.empty(size, dtype=torch.uint8, device=device) for _ in names]
    pinned = [torch.from_numpy(b).pin_memory() for b in blocks]
    try:

        def arena() -> None:
            for h, d in zip(holds, dests, strict=True):
                copier.copy(h.offset, h.length, d, stream)
            stream.synchronize()

        def plain() -> None:
            with torch.cuda.stream(stream):
                for p, d in zip(pinned, dests, strict=True):
                    d.copy_(p, non_blocking=True)
            stream.synchronize()

        arena_s, base_s = paired(arena, plain, args.passes)
        _check(dests, blocks, "the arena copy")
        op = "pinned H2D from the arena" + ("" if copier.registered else " (cudaHostRegister failed)")
        return [_rate("gpu", op, arena_s, "torch copy from a pinned tensor", base_s, total)]
    finally:
        copier.close()
        c.release(holds)


def _gds(
    c: Any, names: list[str], blocks: list[np.ndarray], args: argparse.Namespace, device: Any
) -> list[dict[str, Any]]:
    import torch

    from kvfs.gpu.transfer import Item, KvikioLoader, NixlLoader, TransferUnavailable

    size, total = len(blocks[0]), len(blocks[0]) * len(blocks)
    c.evict(names, tier="dram")
    holds = c.lease(names, promote="never")
    dests = [torch.empty(size, dtype=torch.uint8, device=device) for _ in names]
    items = [Item(h.path, h.offset, h.length, d) for h, d in zip(holds, dests, strict=True)]
    batches = _chunks(len(items), args.batch)
    rows: list[dict[str, Any]] = []
    base = "raw kvikio CuFile.pread"
    try:
        try:
            import kvikio

            def raw() -> None:
                for s in batches:
                    files = [kvikio.CuFile(it.path, "r") for it in items[s]]
                    futs = [f.pread(it.dest[: it.length], it.length, it.offset) for f, it in zip(files, items[s])]
                    for f, fut in zip(files, futs, strict=True):
                        fut.get()
                        f.close()

            raw()
            _check(dests, blocks, "raw kvikio")
        except (ImportError, OSError, RuntimeError) as exc:
            why = f"skipped: kvikio is not usable ({exc})"
            return [
                _skipped("gpu", op, base, why)
                for op in ("GDS read into HBM (kvikio loader)", "GDS read into HBM (NIXL loader)")
            ]
        for label, make in (("kvikio loader", KvikioLoader), ("NIXL loader", NixlLoader)):
            op = f"GDS read into HBM ({label})"
            try:
                loader = make(device)
            except TransferUnavailable as exc:
                rows.append(_skipped("gpu", op, base, f"skipped: {exc}"))
                continue
            stream = torch.cuda.Stream(device)
            for d in dests:
                d.zero_()

            def read(loader: Any = loader, stream: Any = stream) -> None:
                for s in batches:
                    if any(r is not None for r in loader.read(items[s], stream)):
                        raise SystemExit(f"kvfs: bench gpu: a {loader.name} read failed")

            secs, raw_s = paired(read, raw, args.passes)
            _check(dests, blocks, loader.name)
            rows.append(_rate("gpu", f"{op}: {loader.name}", secs, base, raw_s, total))
            loader.close()
        return rows
    finally:
        c.release(holds)


def _hit(c: Any, names: list[str], args: argparse.Namespace, device: Any) -> list[dict[str, Any]]:
    from kvfs.gpu.agent import Agent

    hit_names = names[: args.batch]
    with Agent(c, device=str(device), capacity="8GiB") as ag:
        ag.map(hit_names)
        reps = max(50, args.passes * 20)
        hit_s, look_s = paired(lambda: ag.map(hit_names), lambda: c.lookup(hit_names), reps)
    return [_latency("gpu", f"HBM hit latency, {len(hit_names)} blocks", hit_s, "client lookup round trip", look_s)]


def _ttft(mp: Path, args: argparse.Namespace, device: Any, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Warm TTFT of a random Llama whose prefix is loaded through the agent from HBM, from
    DRAM and from disk, against cold prefill of the whole prompt."""
    import time

    import torch

    from kvfs.client import Client
    from kvfs.gpu.agent import Agent
    from kvfs.gpu.prefix_cache import PrefixCache, namespace_for, prefill
    from kvfs.gpu.random_llama import build_model

    rm = build_model(args.model, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    model = rm.model.to(device)
    directory = mp / "ttft"
    directory.mkdir(exist_ok=True)
    block = getattr(args, "ttft_block", 256)
    ns = namespace_for(model, rm.name, tokens_per_block=block)
    want = min(args.ttft_tokens // block * block, args.ttft_tokens - 1)  # the prefix a warm prefill loads
    vocab = model.config.vocab_size
    tokens = [int(x) for x in torch.randint(0, vocab, (args.ttft_tokens,), generator=torch.Generator().manual_seed(1))]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(fn: Callable[[], Any], cached: int) -> float:
        sync()
        t0 = time.perf_counter()
        out = fn()
        int(out.logits.argmax())  # the first token's id: on the host
        sync()
        secs = time.perf_counter() - t0
        if out.cached_tokens != cached:
            raise SystemExit(f"kvfs: bench gpu: a warm prefill loaded {out.cached_tokens} tokens, not {cached}")
        return secs

    cold = min(timed(lambda: prefill(model, tokens), 0) for _ in range(max(2, args.passes)))
    rows = []
    with Client(mp, write=True, name="kvfs bench gpu ttft") as c, Agent(c, device=str(device), capacity="16GiB") as ag:
        pc = PrefixCache(directory, ns, client=c, agent=ag)
        first = prefill(model, tokens)
        pc.store(tokens, first.cache)
        names = pc.block_names(tokens)
        for tier in ("HBM", "DRAM", "disk"):
            best = float("inf")
            for _ in range(max(2, args.passes)):
                if tier == "HBM":
                    ag.map(names)  # the blocks are in device memory
                else:
                    ag.evict(names)
                    if tier == "DRAM":
                        c.prefetch(names, tier="dram")
                    else:
                        c.evict(names, tier="dram")
                best = min(best, timed(lambda: prefill(model, tokens, pc), want))
            rows.append(_latency("gpu", f"warm TTFT from {tier}, {len(tokens)} tokens", best, "cold prefill", cold))
            say(f"  TTFT from {tier} done")
        pc.close()
    return rows
