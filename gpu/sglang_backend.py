"""An SGLang HiCache storage backend over kvfs's batch client (``KvfsHiCacheStorage``).

SGLang loads it as a third-party backend, no fork (``StorageBackendFactory``'s
``dynamic`` backend)::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvfs",
        "module_path": "kvfs.gpu.sglang_backend", "class_name": "KvfsHiCacheStorage",
        "interface_v1": 1, "kvfs_mount": "/mnt/kvfs"}'

``interface_v1`` makes SGLang's HiCache controller use the zero-copy calls:

- :meth:`~KvfsHiCacheStorage.batch_exists`: the cached prefix length of a batch of page
  keys, one ``lookup`` round trip;
- :meth:`~KvfsHiCacheStorage.batch_get_v1` / :meth:`~KvfsHiCacheStorage.batch_set_v1`:
  pages copied straight between the daemon's shared-memory arena and the host memory
  pool's own tensors (the pages' slices of ``kv_buffer``, as writable memoryviews), in
  one lease (or reserve/commit) round trip per batch; no intermediate bytes.

A page's block holds the bytes of ``host_pool.get_data_page(index, flat=True)`` (what
``HiCacheFile`` writes to its ``.bin`` file), named ``<namespace>/<ab>/<key>`` under a
:class:`kvfs.hashing.Namespace` fixed by the model and the host pool's KV layout (dtype,
layers, heads, head size, page size, layout, TP/PP/CP shard): another layout or shard
never reads these bytes. Any missing, short, oversized or corrupt block is a miss
(``False``: SGLang recomputes), never wrong bytes; the daemon being down is a
:class:`BackendUnavailable` at construction and a miss on every call after (a call waits
at most ``kvfs_timeout`` seconds; the backend reconnects at most every
``kvfs_reconnect_s`` seconds). See docs/engine-sglang.md.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from kvfs.client import BatchError, Client
from kvfs.errors import KvfsError
from kvfs.hashing import Namespace
from kvfs.protocol import DaemonNotAnswering

from .host_io import host_bytes

__all__ = ["BackendSettings", "BackendUnavailable", "KvfsHiCacheStorage", "PageLayout"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the keys SGLang's dynamic loader itself reads from the extra config
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size"}


class BackendUnavailable(KvfsError):
    """Raised at construction when the kvfs daemon cannot be reached."""


@dataclass(frozen=True, kw_only=True)
class BackendSettings:
    """The backend's keys of ``hicache_storage_backend_extra_config`` (all ``kvfs_``)."""

    #: the kvfs mountpoint (or a path in it, or its control socket)
    mount: str
    #: seconds one call waits for the daemon before it counts as a miss
    timeout: float = 10.0
    #: seconds between reconnection attempts after the daemon went away
    reconnect_s: float = 5.0
    #: also check DRAM copies against their checksums (disk copies always are)
    verify: bool = False
    #: the model weights' revision or digest (the namespace's fingerprint)
    weights: str = ""

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> BackendSettings:
        extra = dict(extra or {})
        known = {f"kvfs_{f.name}": f for f in fields(cls)}
        unknown = sorted(k for k in extra if k.startswith("kvfs_") and k not in known)
        if unknown:
            raise ValueError(
                f"unknown kvfs key(s) in hicache_storage_backend_extra_config: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        mount = extra.get("kvfs_mount") or os.environ.get("KVFS_SGLANG_MOUNT")
        if not mount:
            raise ValueError(
                'the kvfs HiCache backend needs the kvfs mountpoint: set "kvfs_mount" in '
                "hicache_storage_backend_extra_config (or $KVFS_SGLANG_MOUNT)"
            )
        values: dict[str, Any] = {"mount": str(mount)}
        for key, f in known.items():
            if key == "kvfs_mount" or key not in extra:
                continue
            v = extra[key]
            try:
                if f.name == "verify":
                    if not isinstance(v, (bool, int)):
                        raise TypeError
                    values[f.name] = bool(v)
                elif f.name == "weights":
                    values[f.name] = str(v)
                else:
                    values[f.name] = float(v)
                    if values[f.name] <= 0:
                        raise ValueError
            except (TypeError, ValueError):
                raise ValueError(f"{key} = {v!r}: expected {f.type} (and > 0 for a time)") from None
        return cls(**values)


class PageLayout:
    """Where a host memory pool keeps each page: the page's bytes (in the order of
    ``get_data_page(index, flat=True)``) as contiguous writable memoryviews of the pool's
    own buffer, and the namespace fields its layout fixes."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.page_size = int(pool.page_size)
        self.size = int(pool.size)
        self.layout = str(pool.layout)
        try:
            page = pool.get_data_page(0, flat=False)
        except (ValueError, NotImplementedError, AttributeError) as exc:
            raise KvfsError(
                f"the kvfs HiCache backend cannot address pages of {type(pool).__name__} with layout "
                f"{self.layout!r} ({exc}); use --hicache-mem-layout page_first (or layer_first, page_first_direct)"
            ) from exc
        if page.device.type != "cpu":
            raise KvfsError(f"the host pool's buffer is on {page.device}, not in host memory")
        self.page_bytes = page.numel() * page.element_size()
        self.dtype = str(page.dtype).removeprefix("torch.")
        self._cache: dict[int, list[memoryview]] = {}
        self._lock = threading.Lock()

    def segments(self, index: int) -> list[memoryview]:
        """The page at token *index* (a multiple of the page size) as memoryviews of the
        pool's buffer, in flat-page order."""
        segs = self._cache.get(index)
        if segs is None:
            if index < 0 or index >= self.size or index % self.page_size:
                raise KvfsError(
                    f"host index {index} is not a page of the pool (size {self.size}, page {self.page_size})"
                )
            segs = [host_bytes(t) for t in _contiguous(self.pool.get_data_page(index, flat=False))]
            if sum(len(s) for s in segs) != self.page_bytes:
                raise KvfsError(f"page {index} of the host pool is not {self.page_bytes} bytes")
            with self._lock:
                self._cache[index] = segs
        return segs

    def namespace(self, config: HiCacheStorageConfig, weights: str) -> Namespace:
        p = self.pool
        shared = config.is_mla_model  # MLA KV is the same on every TP rank: one copy
        extra = ";".join(
            (
                "sglang-hicache",
                f"pool={type(p).__name__}",
                f"layout={self.layout}",
                f"page_bytes={self.page_bytes}",
                f"pp={config.pp_rank}/{config.pp_size}",
                f"cp={config.attn_cp_rank}/{config.attn_cp_size}",
                f"dcp={getattr(config, 'dcp_rank', 0)}/{getattr(config, 'dcp_size', 1)}",
            )
        )
        return Namespace(
            model=config.model_name or "sglang-model",
            dtype=self.dtype,
            num_layers=int(getattr(p, "layer_num", 0)),
            num_kv_heads=int(getattr(p, "head_num", 1)),
            head_size=int(getattr(p, "head_dim", 0) or getattr(p, "kv_cache_dim", 0)),
            tokens_per_block=self.page_size,
            tp_rank=0 if shared else config.tp_rank,
            tp_size=1 if shared else config.tp_size,
            extra=extra,
            weights=weights,
        )


def _contiguous(t: torch.Tensor) -> list[torch.Tensor]:
    """*t* as contiguous pieces in C order (a strided view split along leading dims)."""
    if t.is_contiguous():
        return [t]
    return [piece for i in range(t.shape[0]) for piece in _contiguous(t[i])]


def _pick(names: Sequence[str | None], idx: Sequence[int]) -> list[str]:
    """The names at *idx*, which were chosen among the names that are not None."""
    return [n for i in idx if (n := names[i]) is not None]


def _key_ok(key: str) -> bool:
    return bool(key) and len(key) <= 200 and key.isascii() and "/" not in key and key[0] != "." and "\0" not in key


class KvfsHiCacheStorage(HiCacheStorage):
    """SGLang's ``HiCacheStorage`` on kvfs (module docstring). Constructed by SGLang's
    ``StorageBackendFactory`` as ``KvfsHiCacheStorage(storage_config, kwargs)``; pages
    move once :meth:`register_mem_pool_host` gave it the host pool (SGLang does that
    right after construction)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None) -> None:
        self.config = storage_config
        self.settings = BackendSettings.from_extra(storage_config.extra_config)
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._client: Client | None = None
        try:
            self._client = self._connect()
        except KvfsError as exc:
            raise BackendUnavailable(
                f"kvfs HiCache backend: {exc} (kvfs_mount = {self.settings.mount!r} in "
                "hicache_storage_backend_extra_config)"
            ) from exc
        self.page: PageLayout | None = None
        self.namespace: Namespace | None = None
        self._prefix = ""
        self._warned_pools = False

    # -- setup ---------------------------------------------------------------------------

    def _connect(self) -> Client:
        return Client(
            self.settings.mount,
            write=self.config.is_storage_writer,
            name=f"sglang hicache tp{self.config.tp_rank}",
            timeout=self.settings.timeout,
        )

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self.page = PageLayout(mem_pool_host)
        self.namespace = self.page.namespace(self.config, self.settings.weights)
        self._prefix = self.namespace.dirname()
        log.info("kvfs HiCache backend: pages of %d bytes under %s", self.page.page_bytes, self._prefix)

    def name_of(self, key: str) -> str:
        """The kvfs block name of page *key*."""
        if self.page is None:
            raise KvfsError("the host memory pool is not registered yet (register_mem_pool_host)")
        if not _key_ok(key):
            raise KvfsError(f"{key!r} cannot be a block name")
        return f"{self._prefix}/{key[:2]}/{key}"

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._retry_at = float("inf")
        if client is not None:
            client.close()

    # -- the daemon, or a miss ----------------------------------------------------------

    def _call(self, what: str, fn: Callable[[Client], T], miss: T) -> T:
        """``fn(client)``, or *miss* when the daemon cannot be reached (logged); a broken
        connection is dropped and retried at most every ``kvfs_reconnect_s`` seconds."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None and time.monotonic() >= self._retry_at:
                    try:
                        self._client = self._connect()
                        log.warning("kvfs HiCache backend: reconnected to %s", self.settings.mount)
                    except KvfsError as exc:
                        self._retry_at = time.monotonic() + self.settings.reconnect_s
                        log.warning("kvfs HiCache backend: %s: %s (a miss)", what, exc)
                client = self._client
            if client is None:
                return miss
        try:
            return fn(client)
        except (KvfsError, OSError) as exc:
            log.warning("kvfs HiCache backend: %s failed: %s (a miss)", what, exc)
            if isinstance(exc, (DaemonNotAnswering, OSError)):  # the connection is gone or out of step
                with self._lock:
                    if self._client is client:
                        self._client = None
                        self._retry_at = time.monotonic() + self.settings.reconnect_s
                client.close()
            return miss

    def _names(self, keys: Sequence[str]) -> list[str | None]:
        out: list[str | None] = []
        for k in keys:
            try:
                out.append(self.name_of(k))
            except KvfsError as exc:
                log.warning("kvfs HiCache backend: %s (a miss)", exc)
                out.append(None)
        return out

    def _lookup_prefix(self, names: list[str | None]) -> int:
        """How many leading names are present with exactly a page's bytes."""
        assert self.page is not None
        valid = names[: names.index(None)] if None in names else names
        if not valid:
            return 0
        found = self._call("lookup", lambda c: c.lookup(valid), None)  # type: ignore[arg-type]
        if found is None:
            return 0
        n = 0
        for size in found.sizes:
            if size != self.page.page_bytes:
                break
            n += 1
        return n

    # -- the v1 zero-copy interface ----------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """The number of leading *keys* whose pages are stored (one round trip)."""
        return self._lookup_prefix(self._names(keys))

    def _pages(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[list[memoryview] | None] | None:
        """Each key's page in the host pool (None where its index is bad), or None when
        the indices do not cover the keys' pages."""
        page = self.page
        if page is None:
            log.error("kvfs HiCache backend: no host memory pool registered")
            return None
        if host_indices is None or host_indices.numel() != len(keys) * page.page_size:
            log.error(
                "kvfs HiCache backend: %d keys but %d host indices (page size %d)",
                len(keys),
                0 if host_indices is None else host_indices.numel(),
                page.page_size,
            )
            return None
        out: list[list[memoryview] | None] = []
        for index in host_indices[:: page.page_size].tolist():
            try:
                out.append(page.segments(int(index)))
            except KvfsError as exc:
                log.error("kvfs HiCache backend: %s", exc)
                out.append(None)
        return out

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Copy each page's block into its host-pool page; per key whether it landed whole."""
        pages = self._pages(keys, host_indices)
        if pages is None:
            return [False] * len(keys)
        return self._read(self._names(keys), pages)

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Store each host-pool page as its key's block (pages already stored are kept);
        per key whether it is stored."""
        pages = self._pages(keys, host_indices)
        if pages is None:
            return [False] * len(keys)
        parent = None
        if extra_info is not None and extra_info.prefix_keys:
            parent = self._names(extra_info.prefix_keys[-1:])[0]
        return self._write(self._names(keys), pages, parent)

    def _read(self, names: list[str | None], dests: Sequence[Any]) -> list[bool]:
        assert self.page is not None
        want = self.page.page_bytes
        todo = [i for i, (n, d) in enumerate(zip(names, dests, strict=True)) if n is not None and d is not None]
        ok = [False] * len(names)
        if not todo:
            return ok

        def get(c: Client) -> list[Any]:
            try:
                return list(c.get_into(_pick(names, todo), [dests[i] for i in todo], verify=self.settings.verify))
            except BatchError as exc:
                return list(exc.results)

        for i, r in zip(todo, self._call("get", get, [None] * len(todo)), strict=True):
            ok[i] = r == want  # a size, or the error; anything else than a whole page is a miss
        return ok

    def _write(self, names: list[str | None], srcs: Sequence[Any], parent: str | None) -> list[bool]:
        assert self.page is not None
        want = self.page.page_bytes
        ok = [False] * len(names)
        todo = [i for i, (n, s) in enumerate(zip(names, srcs, strict=True)) if n is not None and s is not None]
        if not todo:
            return ok
        found = self._call("lookup", lambda c: c.lookup(_pick(names, todo)), None)
        if found is None:
            return ok
        put = []
        for i, size in zip(todo, found.sizes, strict=True):
            if size == want:
                ok[i] = True  # already stored: content-addressed, the same bytes
            else:
                put.append(i)
        if not put:
            return ok
        put_names = _pick(names, put)
        parents = [parent if i == 0 else names[i - 1] for i in put]

        def store(c: Client) -> list[Any]:
            try:
                c.put(put_names, [srcs[i] for i in put], parents=parents)
                return [None] * len(put)
            except BatchError as exc:
                return list(exc.results)

        for i, r in zip(put, self._call("put", store, [KvfsError("not stored")] * len(put)), strict=True):
            ok[i] = r is None
        return ok

    # -- the older per-tensor interface (SGLang's generic path) -------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        [got] = self.batch_get([key], [target_location])
        return got

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        """Each block into its tensor (a flat page, contiguous); the tensor, or None."""
        targets = list(target_locations or [None] * len(keys))
        dests = [host_bytes(t) if isinstance(t, torch.Tensor) and t.is_contiguous() else None for t in targets]
        if self.page is not None:
            dests = [d if d is not None and len(d) == self.page.page_bytes else None for d in dests]
        ok = self._read(self._names(keys), dests) if self.page is not None else [False] * len(keys)
        return [t if good else None for t, good in zip(targets, ok, strict=True)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Store each flat page tensor; True when all are stored."""
        if self.page is None:
            return False
        srcs = []
        for v in list(values or [None] * len(keys)):
            ok = isinstance(v, torch.Tensor) and v.numel() * v.element_size() == self.page.page_bytes
            srcs.append(host_bytes(v.contiguous()) if ok else None)
        return all(self._write(self._names(keys), srcs, None))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """The KV prefix; pools besides KV (Mamba, SWA, ...) are not stored here, so with
        any of them nothing is a hit (SGLang recomputes)."""
        if pool_transfers:
            if not self._warned_pools:
                self._warned_pools = True
                log.warning("kvfs HiCache backend stores KV pages only; %s pools are misses", len(pool_transfers))
            return PoolTransferResult(0, {}, [])
        n = self.batch_exists(keys, extra_info)
        return PoolTransferResult(n, {PoolName.KV: n} if n else {}, list(range(1, n + 1)))

    def clear(self) -> bool:
        """Remove every page of this namespace (through the mount: from every tier)."""
        client = self._client
        if client is None or not self._prefix:
            return False
        if not os.path.isdir(client.mountpoint):
            log.error("kvfs HiCache backend: clear() needs kvfs_mount to be the mountpoint, not a socket")
            return False
        root = os.path.join(client.mountpoint, self._prefix)
        if not os.path.isdir(root):
            return True
        try:
            for entry in os.listdir(root):
                shutil.rmtree(os.path.join(root, entry))
        except OSError as exc:
            log.error("kvfs HiCache backend: clearing %s failed: %s", root, exc)
            return False
        return True
