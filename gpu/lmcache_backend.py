"""An LMCache remote storage plugin over kvfs's batch client (``KvfsRemoteConnector``).

LMCache (0.5.6) loads it by module path, no fork: its ``RemoteBackend`` (the one the
``fs`` connector runs under) with this connector::

    remote_storage_plugins: ["kvfs"]
    extra_config:
      remote_storage_plugin.kvfs.module_path: kvfs.gpu.lmcache_backend
      remote_storage_plugin.kvfs.class_name: KvfsRemoteConnector
      remote_storage_plugin.kvfs.kvfs_path: /mnt/kvfs

- **Names.** One kvfs block per LMCache chunk:
  ``<kvfs_namespace>/<model>/<world size>_<worker>_<dtype>[_<tags>]/<ab>/<chunk hash hex>``
  (the fields of LMCache's ``CacheEngineKey``; ``/`` in the model name becomes ``--``).
- **A block** is the chunk's raw bytes (``MemoryObj.byte_array``), then a trailer: magic,
  LMCache's own ``RemoteMetadata`` (length, format, dtypes, shapes, as the fs connector
  writes before the chunk) and a digest of the key; a block whose trailer does not match
  its key, or whose size does not, is a miss, never loaded.
- **Batched, one round trip each**: ``batched_contains`` / ``batched_async_contains`` are
  one ``Client.lookup`` (the cached prefix); ``batched_get`` allocates the chunks'
  ``MemoryObj`` s from LMCache's CPU backend and reads every block straight from the
  arena into their memory (one ``Client.get_into``, no intermediate copy); ``batched_put``
  copies every chunk's memory straight into reserved arena extents (one ``Client.put``).
  LMCache's single-key calls go through the same paths. Gets and lookups run on
  LMCache's storage loop (its caller waits for them anyway); puts in the loop's executor.
- **The daemon down** at start: LMCache's ``RemoteBackend`` logs the connection failure
  and retries on its own schedule; later, each call fails at once while it is down (a
  miss, a failed put) and the session is made again at most every ``kvfs_reconnect_s``
  seconds (:class:`kvfs.client.link.Link`); a call waits at most ``kvfs_timeout_s``.

Settings (``extra_config`` keys ``remote_storage_plugin.<plugin>.<key>``): ``kvfs_path``
(required: the mountpoint, a path in it or the daemon's socket), ``kvfs_namespace``
(``lmcache``), ``kvfs_timeout_s`` (10), ``kvfs_reconnect_s`` (5), ``kvfs_verify`` (check
DRAM copies' checksums too; false). See docs/engine-lmcache.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvfs.client import BatchError, Client
from kvfs.client.link import Link
from kvfs.errors import KvfsError

__all__ = ["ConnectorSettings", "KvfsRemoteConnector"]

log = logging.getLogger("lmcache.kvfs")

T = TypeVar("T")

MAGIC = b"KVFSLMC1"
_HEAD = struct.Struct("<8s16s")  # magic, blake2b-128 of the key's string


@dataclass(frozen=True, kw_only=True)
class ConnectorSettings:
    """The plugin's ``kvfs_`` keys of LMCache's ``extra_config`` (parsed once)."""

    path: str
    namespace: str = "lmcache"
    timeout_s: float = 10.0
    reconnect_s: float = 5.0
    verify: bool = False

    @classmethod
    def from_config(cls, config: LMCacheEngineConfig | None) -> ConnectorSettings:
        extra = dict((config.extra_config if config is not None else None) or {})
        plugins = list((config.remote_storage_plugins if config is not None else None) or [])
        mine = [p for p in plugins if extra.get(f"remote_storage_plugin.{p}.module_path") == __name__]
        plugin = mine[0] if mine else "kvfs"
        prefix = f"remote_storage_plugin.{plugin}."
        known = {f"kvfs_{f.name}": f for f in fields(cls)}
        given = {k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)}
        unknown = sorted(k for k in given if k.startswith("kvfs_") and k not in known)
        if unknown:
            raise ValueError(
                f"kvfs LMCache plugin: unknown key(s) {', '.join(prefix + k for k in unknown)} "
                f"(known: {', '.join(prefix + k for k in sorted(known))})"
            )
        if not given.get("kvfs_path"):
            raise ValueError(
                f"kvfs LMCache plugin: set extra_config {prefix}kvfs_path to the kvfs mountpoint "
                "(or a path in it, or the daemon's control socket)"
            )
        values: dict[str, Any] = {}
        for key, f in known.items():
            if key not in given:
                continue
            v = given[key]
            if f.type in ("bool", bool):
                if not isinstance(v, bool):
                    raise ValueError(f"kvfs LMCache plugin: {prefix}{key} = {v!r}: expected true or false")
            elif f.type in ("float", float):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ValueError(f"kvfs LMCache plugin: {prefix}{key} = {v!r}: expected seconds > 0")
                v = float(v)
            elif not isinstance(v, str) or not v or ".." in v.split("/"):
                raise ValueError(f"kvfs LMCache plugin: {prefix}{key} = {v!r}: expected a non-empty name")
            values[f.name] = v
        return cls(**values)


class KvfsRemoteConnector(RemoteConnector):
    """LMCache's ``RemoteConnector`` on kvfs (module docstring). LMCache constructs it as
    ``KvfsRemoteConnector(loop=..., local_cpu_backend=..., config=...)``."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: LMCacheEngineConfig | None
    ) -> None:
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.settings = ConnectorSettings.from_config(config or local_cpu_backend.config)
        s = self.settings
        self.link = Link(self._connect, s.path, reconnect_s=s.reconnect_s, what="LMCache kvfs plugin")
        try:
            client = self.link.open()
        except KvfsError as exc:  # LMCache logs it and tries again later
            raise KvfsError(f"kvfs LMCache plugin: kvfs_path {s.path!r}: {exc}") from exc
        self._md = RemoteMetadata(
            self.full_chunk_size_bytes, list(self.meta_shapes), list(self.meta_dtypes), self.meta_fmt
        ).serialize()
        self.trailer_size = _HEAD.size + len(self._md)
        self._names: dict[CacheEngineKey, str] = {}
        self._lock = threading.Lock()
        self.stats = {"got": 0, "get_failed": 0, "put": 0, "put_failed": 0}
        log.info(
            "kvfs LMCache plugin: chunks of %d bytes under %s/ on %s",
            self.full_chunk_size_bytes,
            s.namespace,
            client.mountpoint,
        )

    def _connect(self, where: Any) -> Client:
        return Client(where, write=True, name="lmcache", timeout=self.settings.timeout_s)

    # -- names and trailers --------------------------------------------------------------

    def name_of(self, key: CacheEngineKey) -> str:
        name = self._names.get(key)
        if name is None:
            model = key.model_name.strip("/").replace("/", "--") or "model"
            part = f"{key.world_size}_{key.worker_id}_{key._dtype_str}"
            if key.tags:
                part += "_" + "_".join(f"{k}%{v}" for k, v in key.tags)
            h = key.chunk_hash_hex
            name = f"{self.settings.namespace}/{model}/{part}/{h[:2]}/{h}"
            with self._lock:
                if len(self._names) > 1 << 16:
                    self._names.clear()
                self._names[key] = name
        return name

    def _trailer(self, key: CacheEngineKey, md: bytes) -> bytes:
        digest = hashlib.blake2b(key.to_string().encode(), digest_size=16).digest()
        return _HEAD.pack(MAGIC, digest) + md

    # -- calls ---------------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self.loop.run_in_executor(None, fn)

    def _present(self, keys: list[CacheEngineKey]) -> int:
        """How many leading keys kvfs holds (with a trailer), in one lookup; 0 when down."""
        if not keys:
            return 0
        names = [self.name_of(k) for k in keys]
        try:
            found = self.link.call(lambda c: c.lookup(names))
        except KvfsError as exc:
            log.warning("kvfs LMCache plugin: lookup of %d chunks failed (misses): %s", len(keys), exc)
            return 0
        n = 0
        for size in found.sizes:
            if size <= self.trailer_size:
                break
            n += 1
        return n

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._present([key]) == 1

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._run(lambda: self.exists_sync(key))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        return self._present(list(keys))

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return await self._run(lambda: self._present(list(keys)))

    def support_batched_get(self) -> bool:
        return True

    # Gets run on LMCache's storage loop itself: its caller is waiting for them, and a
    # hop to an executor thread and back costs more than the copy of a small chunk. They
    # hold the loop at most kvfs_timeout_s (a stopped daemon), then fail at once.

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        [obj] = self._get([key])
        return obj

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return self._get(list(keys))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey]) -> list[MemoryObj]:
        got = self._get(list(keys))
        out: list[MemoryObj] = []
        missed = False
        for obj in got:  # the prefix up to the first miss; the rest given back
            missed = missed or obj is None
            if obj is not None and not missed:
                out.append(obj)
            elif obj is not None:
                obj.ref_count_down()
        return out

    def _get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """Each chunk read straight into a MemoryObj of LMCache's CPU backend (one
        ``get_into``); None where it is missing, damaged or not allocatable."""
        objs: list[MemoryObj | None] = []
        for _ in keys:
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            objs.append(obj)
        todo = [i for i, o in enumerate(objs) if o is not None]
        if len(todo) < len(keys):
            log.warning(
                "kvfs LMCache plugin: LMCache's CPU backend is full: %d chunks are misses", len(keys) - len(todo)
            )
        tails = [bytearray(self.trailer_size) for _ in todo]
        names = [self.name_of(keys[i]) for i in todo]
        bufs = [[objs[i].byte_array, tails[j]] for j, i in enumerate(todo)]  # type: ignore[union-attr]
        try:
            sizes: list[Any] = self.link.call(lambda c: c.get_into(names, bufs, verify=self.settings.verify))
        except BatchError as exc:
            sizes = [r if isinstance(r, int) else f"{type(r).__name__}: {r}" for r in exc.results]
        except KvfsError as exc:
            sizes = [f"{type(exc).__name__}: {exc}"] * len(todo)
        out: list[MemoryObj | None] = [None] * len(keys)
        failed: list[tuple[str, str]] = []
        for j, i in enumerate(todo):
            obj = objs[i]
            assert obj is not None
            why = self._accept(keys[i], obj, sizes[j], tails[j])
            if why is None:
                out[i] = (
                    obj if sizes[j] == self.full_chunk_size_bytes + self.trailer_size else self._partial(obj, sizes[j])
                )
            else:
                obj.ref_count_down()
                if not why.startswith("BlockNotFound"):
                    failed.append((names[j], why))
        self.stats["got"] += sum(o is not None for o in out)
        self.stats["get_failed"] += len(failed)
        if failed:
            log.warning(
                "kvfs LMCache plugin: %d of %d chunks not loaded (first: %s: %s): misses, LMCache recomputes them",
                len(failed),
                len(keys),
                *failed[0],
            )
        return out

    def _accept(self, key: CacheEngineKey, obj: MemoryObj, size: int | str, tail: bytearray) -> str | None:
        """Why the block read into *obj* is not *key*'s chunk, or None."""
        if isinstance(size, str):
            return size
        t = self.trailer_size
        full = self.full_chunk_size_bytes
        if size == full + t:
            got = bytes(tail)
        elif t < size < full + t:  # a partial chunk: its trailer landed in the chunk's memory
            got = bytes(obj.byte_array[size - t : size])
        else:
            return f"{size} bytes, not a chunk of this layout"
        magic, digest = _HEAD.unpack_from(got)
        if magic != MAGIC or digest != hashlib.blake2b(key.to_string().encode(), digest_size=16).digest():
            return "its trailer names another key"
        md = RemoteMetadata.deserialize(got[_HEAD.size :])
        if md.length != size - t or md.fmt != self.meta_fmt or list(md.dtypes) != list(self.meta_dtypes):
            return f"its metadata ({md.length} bytes, {md.fmt}) is not this layout's"
        return None

    def _partial(self, obj: MemoryObj, size: int) -> MemoryObj:
        return self.reshape_partial_chunk(obj, size - self.trailer_size)

    def support_batched_put(self) -> bool:
        return True

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self._run(lambda: self._put([key], [memory_obj]))

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        await self._run(lambda: self._put(list(keys), list(memory_objs)))

    def _put(self, keys: list[CacheEngineKey], objs: list[MemoryObj]) -> None:
        """Every chunk's memory straight into the arena (one ``put``); a failure raises
        (LMCache counts failed puts)."""
        bufs: list[list[Any]] = []
        for key, obj in zip(keys, objs, strict=True):
            data = obj.byte_array
            n = len(data)
            md = self._md if n == self.full_chunk_size_bytes else self._md_of(obj, n)
            bufs.append([data, self._trailer(key, md)])
        names = [self.name_of(k) for k in keys]
        try:
            self.link.call(lambda c: c.put(names, bufs))
        except BatchError as exc:
            self.stats["put"] += len(keys) - len(exc.errors)
            self.stats["put_failed"] += len(exc.errors)
            raise KvfsError(f"kvfs LMCache plugin: {exc}") from None
        except KvfsError:
            self.stats["put_failed"] += len(keys)
            raise
        self.stats["put"] += len(keys)

    def _md_of(self, obj: MemoryObj, n: int) -> bytes:
        md: bytes = RemoteMetadata(
            n, list(obj.get_shapes()), list(obj.get_dtypes()), obj.get_memory_format()
        ).serialize()
        return md

    # -- the rest of the interface -------------------------------------------------------

    async def list(self) -> list[str]:
        return []  # kvfs lists its blocks itself (kvfs ls): LMCache never needs this

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return False  # kvfs evicts by its own policy; LMCache's removals are not forwarded

    async def close(self) -> None:
        self.link.close()

    def __repr__(self) -> str:
        return f"<KvfsRemoteConnector {self.settings.path}>"
