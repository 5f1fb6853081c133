"""kvfs's SGLang HiCache backend (``kvfs.gpu.sglang_backend``) driven by SGLang itself.

Run inside the SGLang virtualenv (``.ci/engines sglang``, where kvfs is installed
editable), by path. Everything SGLang-side is SGLang's own code on CPU: a real
``MHATokenToKVPoolHost`` (the host memory pool, bf16, any of its layouts), the backend
made by ``StorageBackendFactory.create_backend`` (``dynamic`` with ``module_path`` /
``class_name``, as ``--hicache-storage-backend dynamic`` does) or SGLang's ``HiCacheFile``
(``file``), then ``register_mem_pool_host``, and the HiCache controller's own page
transfer functions (``HiCacheController._page_set_zero_copy`` / ``_page_get_zero_copy``
with ``interface_v1``, ``_generic_page_set`` / ``_generic_page_get`` for ``HiCacheFile``),
called on an object holding the three attributes they read (``storage_backend``,
``storage_host_pool``, ``page_size``): the controller itself needs a GPU device pool.
Page keys are SGLang's own chain hash (``get_hash_str``) over 64-token pages.

- ``--phase store``: fill pages at host indices, back them up to storage; report
  ``batch_exists`` (the prefix), the block names (kvfs) and each page's sha256.
- ``--phase load`` (a second engine process): a fresh pool and backend, ``batch_exists``,
  then the prefetch transfer into *other* host indices (``--offset`` pages in); report
  how many pages it took and, per page, whether the bytes equal what was stored.
- ``--phase bench``: ``--rounds`` of set and get of ``--pages`` pages (fresh keys each
  round), the best seconds of each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

from client_report import describe_error, emit, step
from sglang_client import storage_config

PAGE_TOKENS = 64
MISSING = "f" * 64


def _pool(args: argparse.Namespace) -> Any:
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    tokens = (args.pages + args.offset + 1) * PAGE_TOKENS
    shape = (tokens, args.heads, args.head_dim)
    k = tuple(torch.zeros(shape, dtype=torch.bfloat16) for _ in range(args.layers))
    v = tuple(torch.zeros(shape, dtype=torch.bfloat16) for _ in range(args.layers))
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k,
            v=v,
            k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
            layout=KVBufferLayout.NHD,
        ),
        page_size=PAGE_TOKENS,
        head_num=args.heads,
        head_dim=args.head_dim,
        v_head_dim=args.head_dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        info,
        host_to_device_ratio=1.0,
        host_size=0,
        page_size=PAGE_TOKENS,
        layout=args.layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=tokens,
        start_layer=0,
        end_layer=args.layers,
    )


def _config(args: argparse.Namespace, directory: str) -> Any:
    if args.backend == "kvfs":
        extra = {
            "backend_name": "kvfs",
            "module_path": "kvfs.gpu.sglang_backend",
            "class_name": "KvfsHiCacheStorage",
            "interface_v1": 1,
            "kvfs_mount": directory,
            "kvfs_timeout": 20,
            "kvfs_reconnect_s": 0.5,
        }
    else:
        extra = {"file_storage_path": directory}
    extra.update(json.loads(args.extra))
    return storage_config(extra, page_first=args.layout == "page_first")


def _controller(
    args: argparse.Namespace, pool: Any, directory: str
) -> tuple[Any, Callable[[list[str], Any], bool], Callable[[list[str], Any], int]]:
    """The backend as SGLang's attach_storage_backend makes it, and the controller's own
    get/set page functions bound to an object with what they read."""
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    name = "dynamic" if args.backend == "kvfs" else "file"
    backend = StorageBackendFactory.create_backend(name, _config(args, directory), pool)
    backend.register_mem_pool_host(pool)
    ctl = types.SimpleNamespace(storage_backend=backend, storage_host_pool=pool, page_size=PAGE_TOKENS)
    if args.backend == "kvfs":
        get, put = HiCacheController._page_get_zero_copy, HiCacheController._page_set_zero_copy
    else:
        get, put = HiCacheController._generic_page_get, HiCacheController._generic_page_set
    op = types.SimpleNamespace(request_id="kvfs-test", is_terminated=lambda: False)

    def set_pages(keys: list[str], host_indices: Any) -> bool:
        done: bool = put(ctl, keys, host_indices)
        return done

    def get_pages(keys: list[str], host_indices: Any) -> int:
        got: int = get(ctl, op, keys, host_indices)
        return got

    return backend, set_pages, get_pages


def _keys(n: int, salt: int = 0) -> list[str]:
    from sglang.srt.mem_cache.utils import get_hash_str

    keys, prior = [], None
    for i in range(n):
        base = (salt * 1_000_003 + i) * PAGE_TOKENS
        prior = get_hash_str(list(range(base, base + PAGE_TOKENS)), prior)
        keys.append(prior)
    return keys


def _fill(pool: Any, host_indices: Any, n: int, seed: int) -> list[str]:
    """Random bf16 pages at *host_indices*; each page's sha256 (flat-page bytes)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        page = torch.randn(pool.get_dummy_flat_data_page().shape, generator=g).to(torch.bfloat16)
        pool.set_from_flat_data_page(int(host_indices[i * PAGE_TOKENS]), page)
        out.append(_sha(pool, int(host_indices[i * PAGE_TOKENS])))
    return out


def _sha(pool: Any, index: int) -> str:
    import torch

    page = pool.get_data_page(index, flat=True)
    return hashlib.sha256(page.view(torch.uint8).numpy().tobytes()).hexdigest()


def _alloc(pool: Any, pages: int, skip: int) -> Any:
    if skip:
        pool.alloc(skip * PAGE_TOKENS)  # the second engine's pages land elsewhere in its pool
    return pool.alloc(pages * PAGE_TOKENS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["kvfs", "file"], default="kvfs")
    parser.add_argument("--dir", required=True, help="the kvfs mountpoint (kvfs) or file_storage_path (file)")
    parser.add_argument("--phase", choices=["store", "load", "bench", "threads"], required=True)
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--offset", type=int, default=0, help="pages of the pool skipped before the load's")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layout", default="page_first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probe", action="store_true", help="only make the backend; report its error")
    parser.add_argument("--extra", default="{}", help="JSON merged into the backend's extra config")
    parser.add_argument("--flag", default=None, help="outage: a path prefix; waits for FLAG.go, then FLAG.back")
    args = parser.parse_args()

    import torch

    r: dict[str, Any] = {"phase": args.phase, "backend": args.backend, "layout": args.layout}
    pool = _pool(args)
    keys = _keys(args.pages)
    if args.probe:
        step(r, "made", lambda: _controller(args, pool, args.dir) and "constructed")
    elif args.flag:
        r.update(_outage(args, pool, keys))
    elif args.phase == "store":
        backend, set_pages, _ = _controller(args, pool, args.dir)
        idx = _alloc(pool, args.pages, 0)
        r["sha256"] = _fill(pool, idx, args.pages, seed=0)
        step(r, "set", lambda: set_pages(keys, idx))
        step(r, "set_again", lambda: set_pages(keys, idx))  # already stored: kept, still True
        step(r, "batch_exists", lambda: backend.batch_exists([*keys, MISSING]))
        if args.backend == "kvfs":
            r["names"] = [backend.name_of(k) for k in keys]
            r["page_bytes"] = backend.page.page_bytes
    elif args.phase == "load":
        backend, _, get_pages = _controller(args, pool, args.dir)
        step(r, "batch_exists", lambda: backend.batch_exists([*keys, MISSING]))
        idx = _alloc(pool, args.pages, args.offset)
        r["first_index"] = int(idx[0])
        step(r, "got", lambda: get_pages(keys, idx))
        r["sha256"] = [_sha(pool, int(idx[i * PAGE_TOKENS])) for i in range(args.pages)]
        step(r, "exists", lambda: [backend.exists(k) for k in keys[:2]])
        dummy = [pool.get_dummy_flat_data_page() for _ in range(2)]
        step(r, "batch_get_flat", lambda: [t is not None for t in backend.batch_get(keys[:2], dummy)])
        r["batch_get_flat_sha256"] = [hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest() for t in dummy]
    elif args.phase == "threads":
        r.update(_threads(args, pool, keys))
    else:
        r.update(_bench(args, pool))
    emit(r)


def _wait_for(path: str, timeout: float = 1800) -> None:  # a file the test makes: generous is free
    import os

    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def _outage(args: argparse.Namespace, pool: Any, keys: list[str]) -> dict[str, Any]:
    """Store pages, then (the daemon unmounted meanwhile) every call is a quick miss; after
    FLAG.back (mounted again) the backend reconnects and finds the pages."""
    backend, set_pages, get_pages = _controller(args, pool, args.dir)
    idx = _alloc(pool, args.pages, 0)
    _fill(pool, idx, args.pages, seed=0)
    out: dict[str, Any] = {"set": set_pages(keys, idx)}
    open(args.flag + ".ready", "w").close()
    _wait_for(args.flag + ".go")
    t0 = time.monotonic()
    out["down"] = {
        "batch_exists": backend.batch_exists(keys),
        "get": get_pages(keys, idx),
        "set": set_pages(_keys(2, salt=9), idx[: 2 * PAGE_TOKENS]),
        "exists": backend.exists(keys[0]),
    }
    out["down_s"] = time.monotonic() - t0
    open(args.flag + ".missed", "w").close()
    _wait_for(args.flag + ".back")
    deadline = time.monotonic() + 600  # a loaded machine remounts slowly; it ends as soon as it is back
    while backend.batch_exists(keys) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # reconnects at most every kvfs_reconnect_s
    out["back"] = {"batch_exists": backend.batch_exists(keys), "get": get_pages(keys, idx)}
    return out


def _threads(args: argparse.Namespace, pool: Any, keys: list[str]) -> dict[str, Any]:
    """One backend used at once by a prefetch thread (gets of stored pages into other
    indices, bytes checked) and a backup thread (sets of new pages), as SGLang's
    controller does."""
    import threading

    backend, set_pages, get_pages = _controller(args, pool, args.dir)
    src = _alloc(pool, args.pages, 0)
    want = _fill(pool, src, args.pages, seed=0)
    out: dict[str, Any] = {"set": set_pages(keys, src), "gets": [], "sets": []}
    dst = pool.alloc(args.pages * PAGE_TOKENS)

    def prefetch() -> None:
        for _ in range(args.rounds):
            got = get_pages(keys, dst)
            out["gets"].append(
                got == args.pages and [_sha(pool, int(dst[i * PAGE_TOKENS])) for i in range(args.pages)] == want
            )

    def backup() -> None:
        for rnd in range(args.rounds):
            out["sets"].append(set_pages(_keys(args.pages, salt=100 + rnd), src))

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001  (the error is the result)
                out.setdefault("errors", []).append(describe_error(exc))

        return run

    threads = [threading.Thread(target=guarded(prefetch)), threading.Thread(target=guarded(backup))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["stored_after"] = [backend.batch_exists(_keys(args.pages, salt=100 + rnd)) for rnd in range(args.rounds)]
    return out


def _bench(args: argparse.Namespace, pool: Any) -> dict[str, Any]:
    """Best of ``--rounds``: set ``--pages`` pages, then get them into other indices."""
    times: dict[str, list[float]] = {"set_s": [], "get_s": []}
    src = _alloc(pool, args.pages, 0)
    want = _fill(pool, src, args.pages, seed=1)
    dst = pool.alloc(args.pages * PAGE_TOKENS)
    ok = True
    for rnd in range(args.rounds):
        keys = _keys(args.pages, salt=rnd + 1)
        where = args.dir if args.backend == "kvfs" else tempfile.mkdtemp(prefix=f"round{rnd}-", dir=args.dir)
        _, set_pages, get_pages = _controller(args, pool, where)
        t0 = time.perf_counter()
        ok &= all(
            set_pages(keys[i : i + 128], src[i * PAGE_TOKENS : (i + 128) * PAGE_TOKENS])
            for i in range(0, args.pages, 128)
        )
        times["set_s"].append(time.perf_counter() - t0)
        _, _, get_pages = _controller(args, pool, where)  # a fresh backend reads them
        t0 = time.perf_counter()
        got = sum(
            get_pages(keys[i : i + 128], dst[i * PAGE_TOKENS : (i + 128) * PAGE_TOKENS])
            for i in range(0, args.pages, 128)
        )
        times["get_s"].append(time.perf_counter() - t0)
        ok &= got == args.pages and [_sha(pool, int(dst[i * PAGE_TOKENS])) for i in range(args.pages)] == want
    page_bytes = pool.get_data_page(0, flat=True).numel() * 2
    return {
        "ok": bool(ok),
        "bytes": page_bytes * args.pages,
        "times": {k: min(v) for k, v in times.items()},
        "all_times": times,
    }


if __name__ == "__main__":
    main()
