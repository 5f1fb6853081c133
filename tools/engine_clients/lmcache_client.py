"""LMCache 0.5.6's ``StorageManager`` on a KV directory: the fs connector and LocalDiskBackend.

Run inside the LMCache virtualenv (``.ci/engines lmcache``), by path. Each *setup* is one
LMCache config file (YAML, loaded with ``LMCacheEngineConfig.from_file``, as an engine
does with ``LMCACHE_CONFIG_FILE``) whose storage lives in ``<dir>/<setup>``:

- ``plugin``: ``remote_storage_plugins: ["fs"]`` with
  ``extra_config.remote_storage_plugin.fs.base_path`` (the current form);
- ``url``: the legacy ``remote_url: "fs://localhost:0/<path>"`` (a host is required);
- ``odirect``: ``url`` plus ``fs_connector_use_odirect: true`` and
  ``save_chunk_meta: false`` (raw chunks, opened ``O_DIRECT``);
- ``meta_odirect``: ``fs_connector_use_odirect: true`` with the default
  ``save_chunk_meta: true``, where LMCache turns ``O_DIRECT`` off;
- ``refused``: ``remote_url: "fs:///<path>"``, which LMCache refuses ("missing host") and
  then runs without a remote backend, saving nothing;
- ``disk``: no remote; ``local_disk: "<path>"`` with ``extra_config.use_odirect: true``
  (LocalDiskBackend, one ``<key>.pt`` per chunk, raw bytes).

``--phase store`` puts the same chunks (bf16 ``KV_2LTD``, 256 tokens) through
``batched_put`` in every setup and waits for the backends' put tasks. ``--phase load`` is a
second process, as after a restart: for the fs setups a fresh StorageManager (empty CPU
cache) finds the chunks in the directory (``batched_contains``) and reads them
(``batched_get``); for ``disk`` the in-memory index is empty, so LMCache stores the same
keys again -- opening each existing ``.pt`` ``O_WRONLY|O_CREAT|O_DIRECT`` without
``O_TRUNC`` -- and the chunks are then read back from the LocalDiskBackend.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import tempfile
import time
from typing import TYPE_CHECKING, Any, Self

from client_report import describe_error, emit, timed, tree

if TYPE_CHECKING:
    import torch

SETUPS = ("plugin", "url", "odirect", "meta_odirect", "refused", "disk")
MODEL = "kvfs-test/tiny-llama"
LAYERS, CHUNK, KV_HEADS, HEAD_DIM = 4, 256, 2, 64


def common_config(cpu_gb: float = 1) -> str:
    """The YAML every config here starts with (also ``lmcache_backend_client.py``'s):
    *cpu_gb*, the size of LMCache's CPU cache."""
    return f"""\
chunk_size: {CHUNK}
local_cpu: true
max_local_cpu_size: {cpu_gb}
remote_serde: naive
save_unfull_chunk: false
pre_caching_hash_algorithm: sha256_cbor
"""


COMMON = common_config()


def config_text(setup: str, path: str) -> str:
    """The LMCache YAML of *setup* with its storage at *path* (docs/engines.md shows these)."""
    if setup == "plugin":
        return (
            COMMON + f'remote_storage_plugins: ["fs"]\nextra_config:\n  remote_storage_plugin.fs.base_path: "{path}"\n'
        )
    if setup == "url":
        return COMMON + f'remote_url: "fs://localhost:0{path}"\n'
    if setup == "odirect":
        return (
            COMMON + f'remote_url: "fs://localhost:0{path}"\n'
            "extra_config:\n  fs_connector_use_odirect: true\n  save_chunk_meta: false\n"
        )
    if setup == "meta_odirect":
        return COMMON + f'remote_url: "fs://localhost:0{path}"\nextra_config:\n  fs_connector_use_odirect: true\n'
    if setup == "refused":
        return COMMON + f'remote_url: "fs://{path}"\n'
    if setup == "disk":
        return COMMON + f'local_disk: "{path}"\nmax_local_disk_size: 1\nextra_config:\n  use_odirect: true\n'
    raise ValueError(setup)


# LMCache's module loggers do not propagate: its refusals are caught on these
WATCHED_LOGGERS = (
    "lmcache.v1.storage_backend.remote_backend",
    "lmcache.v1.storage_backend.connector.fs_connector",
    "lmcache.v1.storage_backend.local_disk_backend",
)


class _Warnings(logging.Handler):
    """LMCache's warnings and errors while one setup runs (how it reports a refusal)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> Self:
        import importlib

        for name in WATCHED_LOGGERS:
            importlib.import_module(name)  # its import resets the logger's handlers
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in WATCHED_LOGGERS:
            logging.getLogger(name).removeHandler(self)


def storage_manager(config_yaml: str, label: str) -> Any:
    """LMCache's own ``StorageManager`` for the config *config_yaml*, loaded from a file
    (named after *label*) as an engine loads ``LMCACHE_CONFIG_FILE``; this file's model
    and KV shape."""
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    fd, cfg = tempfile.mkstemp(prefix=f"lmcache-{label}-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(config_yaml)
    try:
        config = LMCacheEngineConfig.from_file(cfg)
    finally:
        os.unlink(cfg)
    metadata = LMCacheMetadata(
        model_name=MODEL,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(LAYERS, 2, CHUNK, KV_HEADS, HEAD_DIM),
    )
    return StorageManager(config=config, metadata=metadata, event_manager=EventManager())


def make_chunks(n: int, salt: str = "") -> tuple[list[Any], list[torch.Tensor]]:
    """*n* chunks (bf16 ``KV_2LTD``) and their keys; another *salt*, other keys."""
    import torch
    from lmcache.utils import CacheEngineKey

    g = torch.Generator().manual_seed(len(salt) + 1)
    keys = [
        CacheEngineKey(
            model_name=MODEL,
            world_size=1,
            worker_id=0,
            chunk_hash=int.from_bytes(hashlib.sha256(f"{salt}chunk-{i}".encode()).digest()[:8], "big"),
            dtype=torch.bfloat16,
        )
        for i in range(n)
    ]
    shape = (2, LAYERS, CHUNK, KV_HEADS * HEAD_DIM)  # KV_2LTD
    data = [torch.randn(*shape, generator=g).to(torch.bfloat16) for _ in keys]
    return keys, data


def _backend(sm: Any, setup: str) -> tuple[str | None, Any]:
    """(name, backend) of the setup's storage backend, or (None, None) if LMCache made none."""
    for name, backend in sm.storage_backends.items():
        if setup == "disk" and name == "LocalDiskBackend":
            return name, backend
        if setup != "disk" and name.startswith("RemoteBackend"):
            return name, backend
    return None, None


def _pending(backend: Any) -> int:
    if hasattr(backend, "disk_worker"):
        return len(backend.disk_worker.put_tasks)
    return len(backend.put_tasks)


def _put(sm: Any, backend: Any, keys: list[Any], data: list[torch.Tensor], timeout: float) -> dict[str, Any]:
    from lmcache.v1.memory_management import MemoryFormat

    objs = []
    for d in data:
        obj = sm.allocate(d.shape, d.dtype, fmt=MemoryFormat.KV_2LTD)
        obj.tensor.copy_(d)
        objs.append(obj)
    sm.batched_put(keys, objs)  # registers the put tasks before it returns
    deadline = time.monotonic() + timeout
    while backend is not None and _pending(backend) and time.monotonic() < deadline:
        time.sleep(0.001)
    return {"pending_put_tasks": _pending(backend) if backend is not None else None}


def _get_equal(sm: Any, name: str | None, keys: list[Any], data: list[torch.Tensor]) -> list[bool]:
    import torch

    got = sm.batched_get(keys, location=name)
    out = [g is not None and torch.equal(g.tensor.view(d.shape), d) for g, d in zip(got, data)]
    for g in got:
        if g is not None:
            g.ref_count_down()
    return out


def run_setup(
    setup: str, root: str, phase: str, keys: list[Any], data: list[torch.Tensor], timeout: float
) -> dict[str, Any]:
    path = os.path.join(root, setup)
    if setup in ("odirect", "meta_odirect"):
        os.makedirs(path, exist_ok=True)  # O_DIRECT setups statvfs the path before creating it
    r: dict[str, Any] = {}
    times: dict[str, float] = {}
    with _Warnings() as warnings:
        _run(setup, path, phase, keys, data, timeout, r, times)
    r["warnings"] = sorted({_redact(m, path) for m in warnings.messages})
    r["times"] = times
    r["tree"] = tree(path) if os.path.isdir(path) else None
    return r


def _redact(message: str, path: str) -> str:
    """A warning without the directory (the kvfs and the plain run must compare equal)."""
    return message.replace(path, "<dir>")


def _run(
    setup: str,
    path: str,
    phase: str,
    keys: list[Any],
    data: list[torch.Tensor],
    timeout: float,
    r: dict[str, Any],
    times: dict[str, Any],
) -> None:
    sm = storage_manager(config_text(setup, path), setup)
    try:
        name, backend = _backend(sm, setup)
        r["backend"] = name
        conn = getattr(backend, "connection", None)
        r["connected"] = conn is not None if setup != "disk" else None
        if conn is not None:
            inner = conn.getWrappedConnector() if hasattr(conn, "getWrappedConnector") else conn
            r["use_odirect"] = bool(getattr(inner, "use_odirect", False))
            r["save_chunk_meta"] = bool(getattr(inner, "save_chunk_meta", True))
        if phase == "store" or setup == "disk":
            # the disk setup's second process stores again: its index starts empty
            if setup == "disk" and phase == "load":
                r["contains_before_restore"] = sm.batched_contains(keys, search_range=[name])[0]
            with timed(times, "write_s"):
                r["put"] = _put(sm, backend, keys, data, timeout)
        if name is not None:
            r["contains"] = sm.batched_contains(keys, search_range=[name])[0]
            if phase == "load" or setup == "disk":
                with timed(times, "read_s"):
                    r["get_equal"] = _get_equal(sm, name, keys, data)
    except Exception as exc:  # noqa: BLE001  (the error is the result: the caller compares it)
        r["error"] = describe_error(exc)
    finally:
        sm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--phase", choices=["store", "load"], required=True)
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"comma separated, of {', '.join(SETUPS)}")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for put tasks")
    args = parser.parse_args()
    keys, data = make_chunks(args.chunks)
    out = {"phase": args.phase, "bytes": sum(d.numel() * 2 for d in data), "setups": {}}
    for setup in args.setups.split(","):
        out["setups"][setup] = run_setup(setup, args.dir, args.phase, keys, data, args.timeout)
    emit(out)


if __name__ == "__main__":
    main()
