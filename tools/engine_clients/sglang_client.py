"""SGLang's own HiCache file backend (``HiCacheFile``) on a KV directory.

Run inside the SGLang virtualenv (``.ci/engines sglang``: ``sglang`` without its CUDA
dependency tree, plus what ``sglang.srt.mem_cache.hicache_storage`` imports), by path.
Pages are keyed with SGLang's own chain hash (``get_hash_str`` over 64 token ids a page)
and hold bf16 KV of a page-first layout.

- ``--phase store``: a ``HiCacheFile`` (no metadata cache): ``set`` one page and
  ``batch_set`` the rest (each: ``exists``, ``ndarray.tofile(".<uuid4>.tmp")``,
  ``os.replace`` onto ``<key>_<model>_0_1.bin``), ``set`` of a page that exists (skipped),
  ``exists``, ``batch_exists_v2`` (``os.path.isfile`` per page, the cached prefix length),
  ``get`` / ``batch_get`` (``open(..., buffering=0).readinto``) and a missing page.
- ``--phase load`` (a second process, as after a restart): a ``HiCacheFile`` with its
  metadata cache on (one ``os.listdir`` of the directory at start), ``exists`` from that
  cache, ``batch_get``, then ``clear()`` (``listdir``, ``isfile``, ``os.remove`` each).

The result says, per step, what SGLang returned and whether the bytes read equal the
pages written (``client_report.step`` records an exception as the step's result).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from client_report import emit, step, timed, tree

PAGE_TOKENS = 64


def storage_config(extra: dict[str, Any], *, page_first: bool = True) -> Any:
    """The ``HiCacheStorageConfig`` of one unsharded rank of the test model."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=page_first,
        model_name="kvfs-test/tiny-llama",
        extra_config=extra,
    )


def _storage(directory: str, metadata_cache: bool) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    return HiCacheFile(storage_config({"file_storage_path": directory, "enable_metadata_cache": metadata_cache}))


def _pages(n: int, layers: int, heads: int, head_dim: int) -> Any:
    import torch
    from sglang.srt.mem_cache.utils import get_hash_str

    g = torch.Generator().manual_seed(0)
    keys, prior = [], None
    for i in range(n):
        prior = get_hash_str(list(range(i * PAGE_TOKENS, (i + 1) * PAGE_TOKENS)), prior)
        keys.append(prior)
    pages = [
        torch.randn(2, layers, PAGE_TOKENS, heads, head_dim, generator=g).to(torch.bfloat16).flatten() for _ in keys
    ]
    return keys, pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="file_storage_path")
    parser.add_argument("--phase", choices=["store", "load"], required=True)
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()

    import torch

    keys, pages = _pages(args.pages, args.layers, args.heads, args.head_dim)
    missing = "f" * 64
    times: dict[str, float] = {}
    r: dict[str, Any] = {"phase": args.phase, "times": times, "bytes": sum(p.numel() * 2 for p in pages)}

    def get_all(storage: Any) -> list[Any]:
        targets = [torch.empty_like(p) for p in pages]
        got = storage.batch_get(keys, targets)
        return [g is not None and torch.equal(g, p) for g, p in zip(got, pages)]

    if args.phase == "store":
        storage = _storage(args.dir, metadata_cache=False)
        with timed(times, "write_s"):
            step(r, "set_first", lambda: storage.set(keys[0], pages[0]))
            step(r, "batch_set_rest", lambda: storage.batch_set(keys[1:], pages[1:]))
        step(r, "set_existing_skipped", lambda: storage.set(keys[0], torch.zeros_like(pages[0])))
        step(r, "exists", lambda: [storage.exists(k) for k in [*keys, missing]])
        step(r, "batch_exists_v2", lambda: storage.batch_exists_v2([*keys, missing]).__dict__)
        step(r, "get_first_equal", lambda: torch.equal(storage.get(keys[0], torch.empty_like(pages[0])), pages[0]))
        step(r, "get_missing_is_none", lambda: storage.get(missing, torch.empty_like(pages[0])) is None)
        with timed(times, "read_s"):
            step(r, "batch_get_equal", lambda: get_all(storage))
        r["tree"] = tree(args.dir)
    else:
        storage = _storage(args.dir, metadata_cache=True)  # listdir at start
        step(r, "metadata_cache_exists", lambda: [storage.exists(k) for k in [*keys, missing]])
        with timed(times, "read_s"):
            step(r, "batch_get_equal", lambda: get_all(storage))
        r["tree"] = tree(args.dir)
        step(r, "clear", storage.clear)
        step(r, "after_clear", lambda: sorted(os.listdir(args.dir)))
        step(r, "exists_after_clear", lambda: [storage.exists(k) for k in keys])
    emit(r)


if __name__ == "__main__":
    main()
