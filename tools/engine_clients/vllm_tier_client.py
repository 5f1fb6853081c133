"""vLLM's tiered offloading with a secondary tier, driven through vLLM's own classes.

Run inside the vLLM virtualenv (kvfs installed there by ``.ci/engines``), by path. Each
process builds a real ``TieringOffloadingSpec`` from a real ``OffloadingConfig`` (one KV
group, no parallelism) and takes its ``TieringOffloadingManager``: the CPU primary tier
over vLLM's ``SharedOffloadRegion`` (the memoryview the secondary tiers copy to and from)
and the secondary tier made by ``SecondaryTierFactory`` from its config dict --
``{"type": "KvfsTier", "module_path": "kvfs.gpu.vllm_tier", "kvfs_path": DIR}`` (``--tier
kvfs``) or vLLM's own ``{"type": "fs", "root_dir": DIR}`` (``--tier fs``). It then calls
the manager as vLLM's scheduler does (keys are vLLM ``OffloadKey`` s of one request's
chain):

- ``--phase store``: ``prepare_store`` of every key, the chunk bytes written into the
  primary rows (what the GPU->CPU copy does), ``complete_store`` (which cascades to the
  secondary tier), then ``on_schedule_end`` steps until every cascade job finished;
- ``--phase load`` (a new process, empty primary tier): ``lookup`` of every key, step
  after step (``on_schedule_end``), until each is ``HIT`` or ``MISS`` -- a secondary hit
  is promoted into the primary tier by a ``submit_load`` -- then ``prepare_load`` and the
  primary rows compared with what was stored;
- ``--phase stall`` (kvfs): store, then stop the daemon (``SIGSTOP`` of ``--daemon-pid``)
  with a load and a store job in flight and fresh keys to look up, and step until every
  job finished and every lookup answered; the daemon is continued after, and the tier
  must find the stored keys again once it reconnects.

The result: per key the final lookup, per block whether the loaded bytes are the stored
ones, the jobs' outcomes, the tier's stats (``get_stats``: vLLM's metrics payload), its
medium and locality, and the seconds each phase took.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from client_report import emit


def _config(args: argparse.Namespace, tier: dict[str, Any], n: int = 0) -> Any:
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    block = args.block_kib * 1024
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0.attn",), group_id=0),),
        worker_kv_bytes_per_block=block // args.tp,  # each TP worker holds its share of the heads
        enable_kv_cache_events=args.events,
        extra_config={"cpu_bytes_to_use": 2 * args.blocks * block + (8 << 20), "secondary_tiers": [tier]},
        engine_id=f"kvfs-test-{os.getpid()}-{n}",
        model=OffloadingModelConfig(name=args.model, dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=args.tp,
            tp_size=args.tp,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


def _tier(args: argparse.Namespace) -> dict[str, Any]:
    if args.tier == "fs":
        return {"type": "fs", "root_dir": args.dir, "n_read_threads": 16, "n_write_threads": 16}
    tier = {"type": "KvfsTier", "module_path": "kvfs.gpu.vllm_tier", "kvfs_path": args.dir}
    tier["kvfs_timeout_s"] = args.timeout
    tier["kvfs_reconnect_s"] = args.reconnect
    if args.copy:
        tier["kvfs_copy"] = True
    if args.events:
        tier["enable_kv_events"] = True
    return tier


def _keys(n: int, salt: str = "") -> list[Any]:
    from vllm.v1.kv_offload.base import make_offload_key

    return [make_offload_key(hashlib.sha256(f"{salt}chunk-{i}".encode()).digest(), 0) for i in range(n)]


def _chunk(i: int, size: int, salt: str = "") -> bytes:
    seed = hashlib.sha256(f"{salt}bytes-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _ctx(req: str, keys: list[Any]) -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id=req)
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    return ctx


def _step(manager: Any) -> None:
    from vllm.v1.kv_offload.base import ScheduleEndContext

    manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def _until(cond: Callable[[], bool], manager: Any, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        _step(manager)
        if cond():
            return True
        time.sleep(0.0005)
    return False


def store(manager: Any, view: Any, keys: list[Any], ctx: Any, size: int, salt: str = "") -> dict[str, Any]:
    """GPU->CPU as the worker would, then the cascade to the secondary tier."""
    import numpy as np

    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    ids = [int(c) for c in out.store_spec.chunk_ids]
    rows = np.frombuffer(view, dtype=np.uint8).reshape(view.shape[0], -1)
    for i, c in zip(range(len(keys)), ids, strict=True):
        rows[c, :size] = np.frombuffer(_chunk(i, size, salt), dtype=np.uint8)
    t0 = time.perf_counter()
    manager.complete_store(keys, ctx)
    done = _until(lambda: not manager._jobs, manager, 600)
    seconds = time.perf_counter() - t0
    manager.on_request_finished(ctx)
    return {"stored": len(keys), "cascaded": done, "seconds": seconds}


def load(
    manager: Any, view: Any, keys: list[Any], ctx: Any, size: int, salt: str = "", deadline_s: float = 600
) -> dict[str, Any]:
    """Look every key up (promoting secondary hits) until each is settled; then the bytes."""
    import numpy as np
    from vllm.v1.kv_offload.base import LookupResult

    manager.on_new_request(ctx)
    t0 = time.perf_counter()
    final: list[Any] = [None] * len(keys)

    def settled() -> bool:
        for i, k in enumerate(keys):
            if final[i] in (LookupResult.HIT, LookupResult.MISS):
                continue
            final[i] = manager.lookup(k, ctx)
        return all(r in (LookupResult.HIT, LookupResult.MISS) for r in final)

    done = _until(settled, manager, deadline_s)
    seconds = time.perf_counter() - t0
    hits = [k for k, r in zip(keys, final, strict=True) if r is LookupResult.HIT]
    equal: list[bool | None] = [None] * len(keys)
    if hits:
        spec = manager.prepare_load(hits, ctx)
        rows = np.frombuffer(view, dtype=np.uint8).reshape(view.shape[0], -1)
        where = dict(zip(hits, (int(c) for c in spec.block_ids), strict=True))
        for i, k in enumerate(keys):
            if k in where:
                equal[i] = rows[where[k], :size].tobytes() == _chunk(i, size, salt)
        manager.complete_load(hits, ctx)
    manager.on_request_finished(ctx)
    return {
        "settled": done,
        "lookups": [r.name if r is not None else None for r in final],
        "equal": equal,
        "seconds": seconds,
    }


def _stats(manager: Any) -> dict[str, Any]:
    stats = manager.get_stats()
    if stats is None:
        return {}
    return {k: v for k, v in stats.reduce().items() if "kvfs" in k}


_SPECS = iter(range(1 << 30))


def _manager(args: argparse.Namespace) -> tuple[Any, Any]:
    """A fresh ``TieringOffloadingManager`` (its own primary region) with the tier."""
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    spec = TieringOffloadingSpec(_config(args, _tier(args), next(_SPECS)))
    manager = spec.get_manager()
    return manager, manager.primary_tier.get_kv_memoryview()


def run(args: argparse.Namespace) -> dict[str, Any]:
    size = args.block_kib * 1024
    manager, view = _manager(args)
    tier = manager.secondary_tiers[0]
    keys = _keys(args.blocks)
    out: dict[str, Any] = {
        "phase": args.phase,
        "tier": type(tier).__name__,
        "medium": tier.medium.value if tier.medium else None,
        "locality": tier.locality.value if tier.locality else None,
        "row_bytes": view.strides[0],
    }
    if hasattr(tier, "names"):  # the kvfs tier: the block of each key
        out["names"] = [tier.names.of(k) for k in keys]
    times: dict[str, Any] = {}
    out["times"] = times
    try:
        if args.phase == "store":
            r = store(manager, view, keys, _ctx("store", keys), size)
            times["store_s"] = r.pop("seconds")
            out["store"] = r
            out["events"] = [(len(e.keys), e.medium.value, e.removed) for e in manager.take_events()]
        elif args.phase == "load":
            r = load(manager, view, keys, _ctx("load", keys), size)
            times["load_s"] = r.pop("seconds")
            out["load"] = r
        elif args.phase == "stall":
            out.update(stall(manager, view, keys, size, args, times))
        out["stats"] = _stats(manager)
    finally:
        manager.shutdown()
    return out


def stall(
    manager: Any, view: Any, keys: list[Any], size: int, args: argparse.Namespace, times: dict[str, Any]
) -> dict[str, Any]:
    """The daemon stopped with jobs in flight: every job fails and every lookup misses
    within the tier's deadline; after it continues, the tier finds the blocks again."""
    from vllm.v1.kv_offload.base import LookupResult

    out: dict[str, Any] = {}
    half = len(keys) // 2
    out["store"] = store(manager, view, keys[:half], _ctx("first", keys[:half]), size)
    out["store"].pop("seconds")
    # a second engine (an empty primary tier) finds them in the tier: promotions queued,
    # submitted (submit_load) at the next step -- after the daemon stopped
    reader, rview = _manager(args)
    try:
        ctx = _ctx("load", keys[:half])
        reader.on_new_request(ctx)
        seen: list[Any] = [None] * half

        def queued() -> bool:
            for i, k in enumerate(keys[:half]):
                if seen[i] is not LookupResult.HIT_PENDING:
                    seen[i] = reader.lookup(k, ctx)
            return all(r is LookupResult.HIT_PENDING for r in seen)

        end = time.monotonic() + 120
        while not queued() and time.monotonic() < end:  # the tier's lookups answered: promotions queued
            _step(reader)
            time.sleep(0.0005)
        out["queued_before_stop"] = [r.name if r is not None else None for r in seen]
        os.kill(args.daemon_pid, signal.SIGSTOP)
        t0 = time.perf_counter()
        try:
            _step(reader)  # submit_load of the queued promotions, the daemon stopped
            sctx = _ctx("second", keys[half:])  # and a store of the rest
            reader.on_new_request(sctx)
            prepared = reader.prepare_store(keys[half:], sctx)
            reader.complete_store(prepared.keys_to_store, sctx)
            fresh = _keys(4, salt="fresh-")
            fctx = _ctx("fresh", fresh)
            reader.on_new_request(fctx)
            looked: list[Any] = [None] * len(fresh)

            def fresh_settled() -> bool:
                for i, k in enumerate(fresh):
                    if looked[i] not in (LookupResult.HIT, LookupResult.MISS):
                        looked[i] = reader.lookup(k, fctx)
                return all(r in (LookupResult.HIT, LookupResult.MISS) for r in looked)

            out["jobs_finished"] = _until(lambda: fresh_settled() and not reader._jobs, reader, 300)
            times["stalled_s"] = time.perf_counter() - t0
            out["fresh_lookups"] = [r.name if r is not None else None for r in looked]
            out["promoted_lookups"] = [reader.lookup(k, ctx).name for k in keys[:half]]
            out["stats_stalled"] = _stats(reader)
            for c in (ctx, sctx, fctx):
                reader.on_request_finished(c)
        finally:
            os.kill(args.daemon_pid, signal.SIGCONT)
        # the daemon answers again: once the tier reconnected, the stored blocks load
        deadline = time.monotonic() + 300
        again: dict[str, Any] = {}
        n = 0
        while time.monotonic() < deadline:
            n += 1
            again = load(reader, rview, keys[:half], _ctx(f"again-{n}", keys[:half]), size, deadline_s=60)
            if all(again["equal"]):
                break
            time.sleep(args.reconnect / 4)
        again.pop("seconds", None)
        out["after"] = again
        out["stats_after"] = _stats(reader)
    finally:
        reader.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", choices=("kvfs", "fs"), default="kvfs")
    parser.add_argument("--dir", required=True, help="kvfs: the mount (or its socket); fs: the tier's root_dir")
    parser.add_argument("--phase", choices=("store", "load", "stall"), default="store")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--model", default="kvfs-test/tiny-llama")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size the config claims")
    parser.add_argument("--timeout", type=float, default=5.0, help="kvfs_timeout_s")
    parser.add_argument("--reconnect", type=float, default=5.0, help="kvfs_reconnect_s")
    parser.add_argument("--copy", action="store_true", help="kvfs_copy: through a private copy buffer")
    parser.add_argument("--events", action="store_true", help="KV events on (enable_kv_events)")
    parser.add_argument("--daemon-pid", type=int, default=0, help="stall: the kvfs daemon to stop")
    args = parser.parse_args()
    emit(run(args))


if __name__ == "__main__":
    main()
