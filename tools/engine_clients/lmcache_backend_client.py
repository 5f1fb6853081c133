"""LMCache 0.5.6's ``StorageManager`` with kvfs's remote storage plugin, or its fs connector.

Run inside the LMCache virtualenv (kvfs installed there by ``.ci/engines``), by path. The
config is the YAML an engine gives LMCache (``LMCACHE_CONFIG_FILE``), loaded with
``LMCacheEngineConfig.from_file``; the storage manager is LMCache's own, with its
``RemoteBackend`` and, per ``--backend``:

- ``kvfs``: ``remote_storage_plugins: ["kvfs"]``,
  ``remote_storage_plugin.kvfs.module_path: kvfs.gpu.lmcache_backend``,
  ``class_name: KvfsRemoteConnector``, ``kvfs_path: <dir>`` (the mount);
- ``fs``: LMCache's own fs connector on ``<dir>`` (``remote_storage_plugins: ["fs"]``,
  ``remote_storage_plugin.fs.base_path``), the plain-directory baseline.

``--phase store`` puts chunks (bf16 ``KV_2LTD``, 256 tokens; the shape of
``lmcache_client.py``) with ``batched_put`` and waits for the put tasks; ``--phase load``
(a second process, an empty CPU cache) counts them (``batched_contains``) and reads them
(``batched_get`` from the remote backend), comparing the bytes. ``--phase bench``: per
round fresh keys, a ``batched_put`` of every chunk (until its put tasks finished), then a
second storage manager of the same process (its own empty CPU cache) gets them; the best
round of each is reported.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

from lmcache_client import _pending, common_config, make_chunks, storage_manager

from client_report import describe_error, emit

if TYPE_CHECKING:
    import torch


def config_text(backend: str, path: str, cpu_gb: float) -> str:
    common: str = common_config(cpu_gb)  # a sibling module: Any to mypy (pyproject.toml)
    if backend == "kvfs":
        return common + (
            'remote_storage_plugins: ["kvfs"]\n'
            "extra_config:\n"
            "  remote_storage_plugin.kvfs.module_path: kvfs.gpu.lmcache_backend\n"
            "  remote_storage_plugin.kvfs.class_name: KvfsRemoteConnector\n"
            f'  remote_storage_plugin.kvfs.kvfs_path: "{path}"\n'
            "  remote_storage_plugin.kvfs.kvfs_timeout_s: 5\n"
        )
    return common + f'remote_storage_plugins: ["fs"]\nextra_config:\n  remote_storage_plugin.fs.base_path: "{path}"\n'


def _remote(sm: Any) -> tuple[str | None, Any]:
    for name, backend in sm.storage_backends.items():
        if name.startswith("RemoteBackend"):
            return name, backend
    return None, None


def _put(sm: Any, name: str | None, backend: Any, keys: list[Any], data: list[torch.Tensor], timeout: float) -> float:
    """Seconds from ``batched_put`` until every chunk is stored: its put tasks done and
    the remote backend finds every key (a backend with batched puts, as kvfs's, keeps no
    put tasks LMCache could wait on)."""
    from lmcache.v1.memory_management import MemoryFormat

    objs = []
    for d in data:
        obj = sm.allocate(d.shape, d.dtype, fmt=MemoryFormat.KV_2LTD)
        obj.tensor.copy_(d)
        objs.append(obj)
    t0 = time.perf_counter()
    sm.batched_put(keys, objs)
    deadline = time.monotonic() + timeout
    stored = False
    while time.monotonic() < deadline:
        if not _pending(backend) and backend.batched_contains(keys) == len(keys):
            stored = True
            break
    seconds = time.perf_counter() - t0
    for o in objs:
        o.ref_count_down()
    if not stored:
        raise RuntimeError(f"the chunks were not all stored after {timeout} s")
    return seconds


def _get(sm: Any, name: str | None, keys: list[Any], data: list[torch.Tensor]) -> tuple[float, list[bool]]:
    import torch

    t0 = time.perf_counter()
    got = sm.batched_get(keys, location=name)
    seconds = time.perf_counter() - t0
    equal = [g is not None and torch.equal(g.tensor.view(d.shape), d) for g, d in zip(got, data)]
    for g in got:
        if g is not None:
            g.ref_count_down()
    return seconds, equal


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": args.backend, "phase": args.phase}
    times: dict[str, Any] = {}
    out["times"] = times
    keys, data = make_chunks(args.chunks)
    out["bytes"] = sum(d.numel() * d.element_size() for d in data)
    sm = storage_manager(config_text(args.backend, args.dir, args.cpu_gb), args.backend)
    try:
        name, backend = _remote(sm)
        conn = getattr(backend, "connection", None)
        out["connected"] = conn is not None
        if conn is None:
            out["contains"] = sm.batched_contains(keys)[0]
            return out
        if args.phase == "store":
            times["put_s"] = _put(sm, name, backend, keys, data, args.timeout)
            out["put_failed"] = backend.put_failed_count if hasattr(backend, "put_failed_count") else None
        elif args.phase == "load":
            out["contains"] = sm.batched_contains(keys, search_range=[name])[0]
            times["get_s"], out["get_equal"] = _get(sm, name, keys, data)
        else:
            out.update(bench(sm, name, backend, args, times))
    except Exception as exc:  # noqa: BLE001  (the error is the result)
        out["error"] = describe_error(exc)
    finally:
        sm.close()
    return out


def bench(sm: Any, name: str | None, backend: Any, args: argparse.Namespace, times: dict[str, Any]) -> dict[str, Any]:
    """Best of ``--rounds``: a put of fresh chunks, then a get by a second manager of
    this process (its own CPU cache, which has none of them), as a second engine would."""
    puts, gets, ok = [], [], True
    reader = storage_manager(config_text(args.backend, args.dir, args.cpu_gb), args.backend)
    try:
        rname, _ = _remote(reader)
        for r in range(args.rounds):
            keys, data = make_chunks(args.chunks, salt=f"{os.getpid()}-{time.time_ns()}-round-{r}-")  # new keys
            puts.append(_put(sm, name, backend, keys, data, args.timeout))
            seconds, equal = _get(reader, rname, keys, data)
            gets.append(seconds)
            ok = ok and all(equal)
    finally:
        reader.close()
    times["put_s"], times["get_s"] = min(puts), min(gets)
    return {"ok": ok, "rounds": args.rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("kvfs", "fs"), required=True)
    parser.add_argument("--dir", required=True, help="kvfs: the mount (or its socket); fs: the directory")
    parser.add_argument("--phase", choices=("store", "load", "bench"), required=True)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-gb", type=float, default=1.0, help="LMCache's max_local_cpu_size")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for put tasks")
    args = parser.parse_args()
    emit(run(args))


if __name__ == "__main__":
    main()
