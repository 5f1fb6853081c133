"""vLLM's native filesystem tier (``vllm.v1.kv_offload.tiering.fs``) driven directly.

In an engine it is ``OffloadingConnector`` + ``TieringOffloadingSpec`` with
``secondary_tiers: [{"type": "fs", "root_dir": ROOT}]``, which vLLM refuses on a CPU
machine ("only supported on CUDA-alike and XPU GPUs"). Its file I/O is plain Python and a
C extension (``vllm.fs_io_C``) and runs anywhere, so this script builds the real
``FileSystemTierManager`` over a page-aligned host buffer (the primary tier's view) and
drives it as the scheduler would:

- construction writes ``<root>/<model>_<digest>/config.json`` and probes ``O_DIRECT``
  there (``probe_o_direct``: create, write one page, close, remove ``.o_direct_probe_*``);
- ``submit_store`` of N blocks: per block ``exists``, ``makedirs``, open
  ``<hash>.bin_<n>.tmp`` with ``O_CREAT|O_EXCL|O_WRONLY|O_TRUNC[|O_DIRECT]``, one write,
  close, ``rename`` onto ``<root>/<model>_<digest>_r0/<hhh>/<hh>_g0/<hash>.bin``;
- lookups: one ``faccessat`` per block (``batch_lookup``), hits and a miss;
- ``submit_load`` into a zeroed buffer: per block open ``O_RDONLY[|O_DIRECT]``, one
  ``readv``; the bytes are compared with what was stored.

Each run does this twice, in ``<root>/fs_io_C`` through the C extension and in
``<root>/python`` with the module's ``_HAS_FSIO_C`` flags off, i.e. through its Python
fallback (``_store_block`` / ``_load_block``). ``--phase load`` (a second process) only
looks up and loads what a ``store`` process left.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import time
import types
from typing import Any

from client_report import emit, timed, tree


def _spec(model: str) -> types.SimpleNamespace:
    """The parts of an ``OffloadingSpec`` the fs tier reads (one KV group, no parallelism)."""
    group = types.SimpleNamespace(tokens_per_block=16, layer_names=["model.layers.0.self_attn.attn"])
    parallel = types.SimpleNamespace(tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, rank=0, is_parallelism_agnostic=True)
    config = types.SimpleNamespace(
        groups=[group],
        parallel=parallel,
        canonical_layout=False,
        replicated_layout=False,
        kv_cache_layout=None,
        model=types.SimpleNamespace(name=model, dtype="bfloat16"),
        cache=types.SimpleNamespace(tokens_per_hash=16),
    )
    return types.SimpleNamespace(
        config=config, blocks_per_chunk=1, kv_events_config=types.SimpleNamespace(enable_kv_cache_events=False)
    )


def _block_bytes(i: int, size: int) -> bytes:
    seed = hashlib.sha256(f"block-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _wait(manager: Any, job_id: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for res in manager.get_finished_jobs():
            if res.job_id == job_id:
                return {"success": res.success, "bytes": res.transfer_bytes}
        time.sleep(0.001)
    return {"success": None, "error": f"job {job_id} did not finish within {timeout} s"}


def run_tier(root: str, phase: str, io: str, n: int, size: int, model: str, timeout: float) -> dict[str, Any]:
    import numpy as np
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob
    from vllm.v1.kv_offload.tiering.fs import io as fs_io
    from vllm.v1.kv_offload.tiering.fs import manager as fs_manager

    # read at every call, so the flags pick the path for this tier's I/O
    fs_io._HAS_FSIO_C = fs_manager._HAS_BATCH_LOOKUP_C = io == "fs_io_C"
    arena = mmap.mmap(-1, n * size)  # page-aligned, as O_DIRECT needs
    view = np.frombuffer(arena, dtype=np.uint8).reshape(n, size)
    expected = b"".join(_block_bytes(i, size) for i in range(n))
    keys = [make_offload_key(hashlib.sha256(f"key-{i}".encode()).digest()[:16], 0) for i in range(n)]
    missing = make_offload_key(hashlib.sha256(b"never stored").digest()[:16], 0)
    ctx = ReqContext(req_id="kvfs-test")
    times: dict[str, float] = {}
    out: dict[str, Any] = {"times": times, "bytes": n * size}

    tier = fs_manager.FileSystemTierManager(
        _spec(model),
        memoryview(view),  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer from Python 3.12 only
        "fs",
        root,
        n_read_threads=4,
        n_write_threads=4,
    )
    try:
        out["use_o_direct"] = tier._use_o_direct
        out["config_json"] = tier.file_mapper.get_config_file_path()[len(root) :]
        if phase == "store":
            view[:] = np.frombuffer(expected, dtype=np.uint8).reshape(n, size)
            with timed(times, "store_s"):
                tier.submit_store(
                    TransferJob(job_id=1, keys=keys, chunk_ids=np.arange(n), is_promotion=False, req_context=ctx)
                )
                out["store"] = _wait(tier, 1, timeout)
        with timed(times, "lookup_s"):
            out["lookup"] = [bool(x) for x in tier._lookup_manager.batch_lookup([*keys, missing], ctx)]
        view[:] = 0
        with timed(times, "load_s"):
            tier.submit_load(
                TransferJob(job_id=2, keys=keys, chunk_ids=np.arange(n), is_promotion=True, req_context=ctx)
            )
            out["load"] = _wait(tier, 2, timeout)
        got = view.tobytes()
        out["loaded_blocks_equal"] = [
            got[i * size : (i + 1) * size] == expected[i * size : (i + 1) * size] for i in range(n)
        ]
    finally:
        tier.shutdown()
    out["tree"] = tree(root)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="where the tiers' root_dirs go")
    parser.add_argument("--phase", choices=["store", "load"], default="store")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--model", default="kvfs-test/tiny-llama")
    parser.add_argument("--io", default="fs_io_C,python", help="which I/O paths, comma separated")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    out: dict[str, Any] = {"phase": args.phase}
    for io in args.io.split(","):
        root = os.path.join(args.root, io)
        out[io] = run_tier(root, args.phase, io, args.blocks, args.block_kib * 1024, args.model, args.timeout)
    emit(out)


if __name__ == "__main__":
    main()
