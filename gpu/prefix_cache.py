"""A prefix cache for Hugging Face transformers models, kept as files in a directory.

After a forward pass, :meth:`PrefixCache.store` splits the request's KV cache into blocks
of ``tokens_per_block`` tokens, names each with kvfs's chained hash over the token ids
(:func:`kvfs.hashing.chain_hashes`) under a :class:`~kvfs.hashing.Namespace` fixed by the
model and its KV layout, and writes each block as one file
``<dir>/<namespace dirname>/<ab>/<hex digest>`` (format: :mod:`kvfs.gpu.kv_block_file`).
For a new request, :meth:`PrefixCache.load` reads the blocks of the longest cached prefix
into a ``DynamicCache`` and :func:`prefill` / :func:`generate` compute only the rest.

The directory is any directory: on a kvfs mount the batch client (:mod:`kvfs.client`)
looks blocks up, reads and writes them through the mount's shared-memory arena (one round
trip per batch); elsewhere plain file I/O (``readv`` into preallocated tensors, a temporary
name and ``os.replace``). Both write the same files and check them the same way.

Decisions (also in docs/engines.md):

- Only full blocks are cached. A trailing partial block is recomputed by the next request
  that shares it; it is never written, so a block file always holds exactly
  ``tokens_per_block`` tokens and its name is a pure function of the tokens it covers.
- A request always computes at least its last token (the logits come from it). When the
  whole prompt is cached, the last block is loaded and the cache is cut one token short.
- The prefix stops at the first block that is missing, unreadable, short, of another
  layout, under the wrong name or failing its checksum. Nothing after it is used, so a bad
  block costs recomputation, never wrong KV. An invalid file is removed so that the next
  :meth:`store` can write a good one (a store skips blocks that already exist).
- Blocks are written once (the first writer wins: every writer of a name writes the same KV).

Only models whose every layer is a full-attention ``DynamicLayer`` (Llama, Mistral without
sliding window, Qwen2, ...) are supported, batch size 1; others raise UnsupportedModel.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import xxhash

from kvfs.client import BufferTooSmall, Client, Read
from kvfs.errors import BlockCorrupt, BlockNotFound, KvfsError
from kvfs.hashing import HashFn, Namespace, block_path, chain_hashes, xxh3_128
from kvfs.runtime import find_mount

from .kv_block_file import HEADER_LENGTH, KVBlockHeader, decode_header, encode_header
from .mount_blocks import MountBlocks

try:
    import torch
    from transformers import DynamicCache, PreTrainedModel
    from transformers.cache_utils import DynamicLayer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("kvfs.gpu.prefix_cache needs torch and transformers: pip install 'kvfs[engines]'") from exc

from .agent import Agent  # after the check that torch is there
from .agent_blocks import AgentBlocks
from .host_io import host_bytes, read_full, write_full

__all__ = [
    "Generation",
    "Prefill",
    "PrefixCache",
    "PrefixHit",
    "StopReason",
    "StoreResult",
    "UnsupportedModel",
    "cache_from_tensors",
    "generate",
    "namespace_for",
    "prefill",
]

log = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_TORCH_DTYPES = {name: dt for dt, name in _DTYPE_NAMES.items()}


class UnsupportedModel(KvfsError, ValueError):
    """Raised when a model's cache is not one the prefix cache can split: a sliding-window
    or linear-attention layer, a batch larger than one, or a dtype without a block code."""


class StopReason(str, Enum):
    """Why :meth:`PrefixCache.load` stopped where it did."""

    COMPLETE = "complete"  # every wanted block was loaded
    MISSING = "missing"  # the next block does not exist
    CORRUPT = "corrupt"  # the next block is short, damaged or of another layout
    UNREADABLE = "unreadable"  # opening or reading the next block failed (EIO, EACCES, ...)


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefixHit:
    """The result of a load: a cache holding ``tokens`` tokens of the request's prefix."""

    cache: DynamicCache
    tokens: int  # tokens in ``cache`` (what the model need not compute)
    blocks: int  # block files read and accepted
    wanted: int  # block files the request could have used
    stop: StopReason
    detail: str  # why it stopped, for logs ("" when complete)
    bytes_read: int
    seconds: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreResult:
    written: int  # block files written by this call
    present: int  # blocks that already existed (not rewritten)
    bytes_written: int
    seconds: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Prefill:
    logits: torch.Tensor  # [vocab] logits of the last prompt token, float32
    cache: DynamicCache  # the KV of every prompt token
    cached_tokens: int  # prompt tokens that came from the prefix cache
    hit: PrefixHit | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Generation:
    tokens: list[int]  # the generated token ids (greedy)
    logits: list[torch.Tensor]  # the logits each was chosen from, float32
    cached_tokens: int


def _layout(model: PreTrainedModel) -> tuple[int, int, int]:
    cfg = model.config.get_text_config(decoder=True)
    layers = cfg.num_hidden_layers
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return layers, heads, dim


def namespace_for(
    model: PreTrainedModel,
    model_name: str,
    *,
    tokens_per_block: int = 256,
    dtype: torch.dtype | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    extra: str = "",
) -> Namespace:
    """The namespace of *model*'s KV blocks: its weights' name and its KV layout.

    *model_name* must identify the weights (a hub id plus revision, or a path with a
    version): two models with the same architecture and different weights must not share
    a name. *dtype* defaults to the model's parameter dtype.
    """
    if tokens_per_block < 1:
        raise ValueError("tokens_per_block must be at least 1")
    layers, heads, dim = _layout(model)
    dtype = dtype or next(model.parameters()).dtype
    if dtype not in _DTYPE_NAMES:
        raise UnsupportedModel(f"KV dtype {dtype} is not supported; use float32, float16 or bfloat16")
    return Namespace(
        model=model_name,
        dtype=_DTYPE_NAMES[dtype],
        num_layers=layers,
        num_kv_heads=heads,
        head_size=dim,
        tokens_per_block=tokens_per_block,
        tp_rank=tp_rank,
        tp_size=tp_size,
        extra=extra,
    )


def _empty_cache(model: PreTrainedModel) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise UnsupportedModel(
                f"layer type {type(layer).__name__} is not supported; the prefix cache handles "
                "full-attention layers (DynamicLayer) only"
            )
    return cache


def _dynamic_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The layers of a cache from :func:`_empty_cache` (which checked that each is a DynamicLayer)."""
    return [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]


class PrefixCache:
    """Blocks of one model's KV cache, as files under *directory*.

    *namespace* fixes the model and the layout (see :func:`namespace_for`); *extra_keys*
    (LoRA name, cache salt, ...) go into every block's hash. *hash_fn* is kvfs's chain hash
    function (xxh3-128 by default). *drop_invalid* removes a block file that fails
    validation so the next store can replace it.

    *reuse_buffers* keeps the host buffer of the last load and reads the next load into
    it once nothing references it any more (transformers replaces a layer's tensors when
    a forward pass extends the cache, which releases it). Faulting in fresh pages costs
    more than reading the KV from the page cache, so a serving process should reuse.
    The buffer stays allocated (the size of the largest prefix loaded) until the
    PrefixCache is dropped.

    *io_threads* blocks are read concurrently (reads release the GIL; a disk or a FUSE
    daemon serves several requests at once better than one); 1 reads them one by one.

    *client*: on a kvfs mount (``None``, the default, finds out; ``True`` insists) the
    blocks are looked up, read and written with the batch client (:mod:`kvfs.client`):
    one round trip per batch, the bytes through the mount's shared-memory arena or
    straight from its disk tier's files, each chain's parent given with its block; the
    same files and the same checks as the file path, which ``False`` forces and which
    any other directory uses. A :class:`~kvfs.client.Client` may be passed in.

    *agent*: on a kvfs mount, a load with a *device* goes through the GPU agent
    (:class:`kvfs.gpu.agent.Agent`): the blocks land in device memory from the arena or
    the disk tier's files (kvikio, NIXL, POSIX), checked there, and stay in its device
    cache for the next request; the KV is copied from them on the device. Without one, the
    cache makes an agent per device on the first such load (``device="cpu"`` included).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        namespace: Namespace,
        *,
        extra_keys: Sequence[int | str | bytes] = (),
        hash_fn: HashFn = xxh3_128,
        drop_invalid: bool = True,
        reuse_buffers: bool = True,
        io_threads: int = 4,
        client: Client | bool | None = None,
        agent: Agent | None = None,
    ) -> None:
        self.directory = os.fspath(directory)
        self.namespace = namespace
        self.extra_keys = tuple(extra_keys)
        self.hash_fn = hash_fn
        self.drop_invalid = drop_invalid
        self.reuse_buffers = reuse_buffers
        self._pool: np.ndarray | None = None  # the reusable load buffer (bytes)
        self._pool_lock = threading.Lock()  # loads from several threads never share a buffer
        if io_threads < 1:
            raise ValueError("io_threads must be at least 1")
        self.io_threads = io_threads
        self._io_pool: ThreadPoolExecutor | None = None
        self._mount: MountBlocks | None = None  # the batch client's path, on a kvfs mount
        self._agent = agent
        self._agents: AgentBlocks | None = None  # loads into a device through the GPU agent, on a kvfs mount
        if agent is not None and not isinstance(client, Client):
            client = agent.client
        if isinstance(client, Client):
            self._mount = MountBlocks(namespace, hash_fn, client=client, path_of=self.path, io_threads=io_threads)
        elif client is None or client is True:
            found = find_mount(self.directory)
            if found is None and client is True:
                raise KvfsError(f"{self.directory} is not on a kvfs mount: the batch client cannot serve it")
            if found is not None:
                self._mount = MountBlocks(namespace, hash_fn, mountpoint=found[0], base=found[1], io_threads=io_threads)
        if self._mount is not None:
            self._agents = AgentBlocks(self._mount, agent)
        self.dtype = _TORCH_DTYPES[namespace.dtype]
        self._itemsize = torch.empty((), dtype=self.dtype).element_size()
        self._payload = KVBlockHeader.payload_length_of(
            namespace.dtype,
            namespace.num_layers,
            namespace.num_kv_heads,
            namespace.head_size,
            namespace.tokens_per_block,
        )

    @classmethod
    def for_model(
        cls,
        directory: str | os.PathLike[str],
        model: PreTrainedModel,
        model_name: str,
        *,
        tokens_per_block: int = 256,
        **kwargs: Any,
    ) -> PrefixCache:
        """A prefix cache for *model* (see :func:`namespace_for` for *model_name*)."""
        ns_keys = {k: kwargs.pop(k) for k in ("dtype", "tp_rank", "tp_size", "extra") if k in kwargs}
        ns = namespace_for(model, model_name, tokens_per_block=tokens_per_block, **ns_keys)
        return cls(directory, ns, **kwargs)

    # -- names ---------------------------------------------------------------------------

    @property
    def tokens_per_block(self) -> int:
        return self.namespace.tokens_per_block

    def digests(self, tokens: Sequence[int]) -> list[bytes]:
        """The chain hashes of the full blocks of *tokens*."""
        return chain_hashes(self.namespace, list(tokens), extra_keys=self.extra_keys, hash_fn=self.hash_fn)

    def block_names(self, tokens: Sequence[int]) -> list[str]:
        """The block names (paths inside the mount) of the full blocks of *tokens*; only
        on a kvfs mount (e.g. to pin them in an agent or evict them from a tier)."""
        if self._mount is None:
            raise KvfsError(f"{self.directory} is not on a kvfs mount: its blocks have no names in kvfs")
        return self._mount.names(self.digests(tokens))

    def path(self, digest: bytes) -> str:
        """The file of the block with *digest*."""
        return os.path.join(self.directory, block_path(self.namespace, digest, self.hash_fn))

    def lookup(self, tokens: Sequence[int]) -> int:
        """Tokens of *tokens* whose blocks exist (one batch lookup on a kvfs mount, else
        ``os.path.exists``; not validated)."""
        if self._mount is not None:
            try:
                return self._mount.prefix(self.digests(tokens)) * self.tokens_per_block
            except KvfsError as exc:
                log.warning("prefix cache: the batch client failed (%s); looking the files up", exc)
        n = 0
        for d in self.digests(tokens):
            if not os.path.exists(self.path(d)):
                break
            n += 1
        return n * self.tokens_per_block

    # -- store ---------------------------------------------------------------------------

    def store(self, tokens: Sequence[int], cache: DynamicCache) -> StoreResult:
        """Write the full blocks of *tokens* whose KV is in *cache* and are not stored yet.

        *cache* holds the KV of ``tokens[:cache_len]`` (a batch of one); tokens beyond it
        and a trailing partial block are not written. Raises :class:`UnsupportedModel`
        for a cache it cannot split and ``OSError`` when the directory refuses a write
        (the temporary file is removed first).
        """
        t0 = time.perf_counter()
        ns = self.namespace
        T = ns.tokens_per_block
        layers = cache.layers
        if len(layers) != ns.num_layers:
            raise UnsupportedModel(f"cache has {len(layers)} layers, namespace says {ns.num_layers}")
        seq = cache.get_seq_length()
        digests = self.digests(list(tokens)[: min(len(tokens), seq)])
        if self._mount is not None:
            present = self._mount.present(digests)
            todo = [(i, d) for i, d in enumerate(digests) if not present[i]]
        else:
            todo = [(i, d) for i, d in enumerate(digests) if not os.path.exists(self.path(d))]
        if not todo:
            return StoreResult(written=0, present=len(digests), bytes_written=0, seconds=time.perf_counter() - t0)
        first = todo[0][0] * T
        end = len(digests) * T
        # One [tokens, heads, dim] contiguous copy per layer and K/V; a block is then a
        # contiguous slice of each.
        rows: list[torch.Tensor] = []
        for layer in layers:
            if type(layer) is not DynamicLayer:
                raise UnsupportedModel(f"layer type {type(layer).__name__} is not supported")
            for t in (layer.keys, layer.values):
                if t is None:
                    raise UnsupportedModel("a layer of the cache holds no KV (it was never filled)")
                if t.dim() != 4 or t.shape[0] != 1:
                    raise UnsupportedModel(f"expected a [1, heads, tokens, dim] cache, got {tuple(t.shape)}")
                if t.shape[1] != ns.num_kv_heads or t.shape[3] != ns.head_size or t.dtype != self.dtype:
                    raise UnsupportedModel(
                        f"cache layout {tuple(t.shape)} {t.dtype} does not match the namespace "
                        f"({ns.num_kv_heads} heads of {ns.head_size}, {ns.dtype})"
                    )
                rows.append(t.detach()[0, :, first:end].transpose(0, 1).to("cpu").contiguous())
        blocks: list[tuple[int, bytes, list[memoryview]]] = []
        for i, digest in todo:
            lo = i * T - first
            segs = [host_bytes(r[lo : lo + T]) for r in rows]
            h = xxhash.xxh3_64()
            for s in segs:
                h.update(s)
            header = encode_header(
                KVBlockHeader(
                    dtype=ns.dtype,
                    num_layers=ns.num_layers,
                    num_kv_heads=ns.num_kv_heads,
                    head_size=ns.head_size,
                    tokens=T,
                    payload_length=self._payload,
                    checksum=h.intdigest(),
                    digest=digest[:16],
                )
            )
            blocks.append((i, digest, [memoryview(header), *segs]))
        written = nbytes = 0
        if self._mount is not None:
            self._mount.client()  # connected: whether this mount takes client puts is known now
            if self._mount.puts:
                blocks, written, nbytes = self._mount.put(blocks, digests)
        for _, digest, segments in blocks:  # the file path, or what the client could not put
            nbytes += self._publish(self.path(digest), segments)
            written += 1
        return StoreResult(
            written=written,
            present=len(digests) - written,
            bytes_written=nbytes,
            seconds=time.perf_counter() - t0,
        )

    def _publish(self, path: str, segments: list[memoryview]) -> int:
        """Write *segments* to a temporary name beside *path*, then rename it into place."""
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                n = write_full(fd, segments)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return n

    # -- load ----------------------------------------------------------------------------

    def load(
        self,
        tokens: Sequence[int],
        model: PreTrainedModel,
        *,
        max_tokens: int | None = None,
        device: torch.device | str | None = None,
    ) -> PrefixHit:
        """Load the longest cached prefix of *tokens* into a fresh cache for *model*.

        At most *max_tokens* tokens end up in the cache (default: all full blocks); the
        block holding the last of them is loaded whole and the cache is cut. Reading
        stops at the first block that is missing or fails validation (see
        :class:`StopReason`); nothing from it or after it is used. Never raises for a bad
        or vanished block file; raises :class:`UnsupportedModel` for a model it cannot serve.
        """
        t0 = time.perf_counter()
        ns = self.namespace
        T = ns.tokens_per_block
        L, H, D = ns.num_layers, ns.num_kv_heads, ns.head_size
        if _layout(model) != (L, H, D):
            raise UnsupportedModel(f"model layout {_layout(model)} does not match the namespace {(L, H, D)}")
        tokens = list(tokens)
        limit = len(tokens) if max_tokens is None else max(0, min(max_tokens, len(tokens)))
        digests = self.digests(tokens)[: -(-limit // T)]
        cache = _empty_cache(model)
        if not digests:
            return PrefixHit(
                cache=cache,
                tokens=0,
                blocks=0,
                wanted=0,
                stop=StopReason.COMPLETE,
                detail="",
                bytes_read=0,
                seconds=time.perf_counter() - t0,
            )
        # [layer, K/V, token, head, dim]: a block fills one contiguous [T, H, D] run per
        # layer and K/V, and the cache's [1, H, tokens, D] tensors are views of it.
        agent = self._agents.agent_for(device) if self._agents is not None else None
        if agent is not None and self._agents is not None:
            buf = torch.empty((L, 2, len(digests) * T, H, D), dtype=self.dtype, device=agent.device)
            loaded, nread, stop, detail = self._agents.load(
                agent,
                digests,
                [self.path(d) for d in digests],
                buf,
                header_length=HEADER_LENGTH,
                size=HEADER_LENGTH + self._payload,
                validate=self._validate,
                stop=self._stop,
                reasons=(StopReason.COMPLETE, StopReason.MISSING, StopReason.CORRUPT, StopReason.UNREADABLE),
            )
        elif self._mount is not None:
            buf = self._buffer((L, 2, len(digests) * T, H, D))
            loaded, nread, stop, detail = self._load_via_client(self._mount, digests, buf)
        else:
            buf = self._buffer((L, 2, len(digests) * T, H, D))
            loaded, nread, stop, detail = self._load_via_files(digests, buf)
        ntok = min(loaded * T, limit)
        if ntok:
            if device is not None and torch.device(device) != buf.device:
                buf = buf[:, :, :ntok].to(device)
            for l, layer in enumerate(_dynamic_layers(cache)):
                k = buf[l, 0, :ntok].permute(1, 0, 2).unsqueeze(0)
                v = buf[l, 1, :ntok].permute(1, 0, 2).unsqueeze(0)
                layer.lazy_initialization(k, v)
                layer.keys, layer.values = k, v
        return PrefixHit(
            cache=cache,
            tokens=ntok,
            blocks=loaded,
            wanted=len(digests),
            stop=stop,
            detail=detail,
            bytes_read=nread,
            seconds=time.perf_counter() - t0,
        )

    def _load_via_files(self, digests: list[bytes], buf: torch.Tensor) -> tuple[int, int, StopReason, str]:
        """Read the blocks' files into *buf* in order, stopping at the first bad one:
        ``(blocks accepted, bytes read, why it stopped, detail)``."""
        loaded = nread = 0
        stop, detail = StopReason.COMPLETE, ""
        # Blocks are read ahead by up to io_threads workers and accepted strictly in order;
        # the first failure ends the prefix. Reads in flight are waited for before the
        # buffer is handed out (or reused), since they write into it.
        pending: deque[tuple[int, Future[int] | int | BaseException]] = deque()
        window = 2 * self.io_threads if self.io_threads > 1 else 1
        pool = self._executor() if self.io_threads > 1 else None
        nxt = 0
        try:
            while True:
                while nxt < len(digests) and len(pending) < window:
                    if pool is not None:
                        pending.append((nxt, pool.submit(self._fetch, digests[nxt], nxt, buf)))
                    else:
                        try:
                            pending.append((nxt, self._fetch(digests[nxt], nxt, buf)))
                        except (OSError, BlockCorrupt) as exc:
                            pending.append((nxt, exc))
                    nxt += 1
                if not pending:
                    break
                i, res = pending.popleft()
                path = self.path(digests[i])
                try:
                    if isinstance(res, BaseException):
                        raise res
                    got = res.result() if isinstance(res, Future) else res
                except FileNotFoundError:
                    stop, detail = self._stop(StopReason.MISSING, path, "no such block")
                    break
                except BlockCorrupt as exc:
                    stop, detail = self._stop(StopReason.CORRUPT, path, exc)
                    break
                except OSError as exc:
                    stop, detail = self._stop(StopReason.UNREADABLE, path, exc)
                    break
                loaded += 1
                nread += got
        finally:
            futures = [f for _, f in pending if isinstance(f, Future)]
            for f in futures:
                f.cancel()
            wait(futures)
        return loaded, nread, stop, detail

    def _stop(self, why: StopReason, path: str, what: object) -> tuple[StopReason, str]:
        """Where a load stops at the block *path*: logged; an invalid block is removed so
        that the next store writes a good one."""
        detail = f"{path}: {what}"
        if why is StopReason.CORRUPT:
            log.warning("prefix cache: invalid block, prefix stops here: %s", detail)
            if self.drop_invalid:
                self._drop(path)
        elif why is StopReason.UNREADABLE:
            log.warning("prefix cache: unreadable block, prefix stops here: %s", detail)
        return why, detail

    def _load_via_client(
        self, mount: MountBlocks, digests: list[bytes], buf: torch.Tensor
    ) -> tuple[int, int, StopReason, str]:
        """Read the blocks with the batch client (one lease round trip; bytes from the
        DRAM arena or read straight from a disk tier's files), checking each as the
        file path does."""
        L = buf.shape[0]
        T = self.namespace.tokens_per_block
        size = HEADER_LENGTH + self._payload
        headers = [bytearray(HEADER_LENGTH) for _ in digests]
        segs = [
            [memoryview(h), *(host_bytes(buf[l, kv, i * T : (i + 1) * T]) for l in range(L) for kv in (0, 1))]
            for i, h in enumerate(headers)
        ]
        checks: list[BlockCorrupt | None] = [None] * len(digests)

        def check(i: int, r: Read) -> None:
            # kvfs's checksum (verified on block files) says the bytes are the ones sealed
            # under this name; only the payload's own checksum says they are the KV its
            # header describes (a program may have rewritten the file). Checked by the
            # copying thread, beside the next copies.
            try:
                self._validate(headers[i], segs[i][1:], r.size, size, digests[i])
            except BlockCorrupt as exc:
                checks[i] = exc

        try:
            got = mount.read(digests, segs, check)
        except KvfsError as exc:  # the daemon is gone: as a file read of a dead mount, unreadable
            return (0, 0, *self._stop(StopReason.UNREADABLE, self.path(digests[0]), exc))
        loaded = nread = 0
        for i, (d, res) in enumerate(zip(digests, got, strict=True)):
            path = self.path(d)
            if isinstance(res, BlockNotFound):
                return (loaded, nread, *self._stop(StopReason.MISSING, path, "no such block"))
            if isinstance(res, (BlockCorrupt, BufferTooSmall)):
                return (loaded, nread, *self._stop(StopReason.CORRUPT, path, res))
            if isinstance(res, KvfsError):
                return (loaded, nread, *self._stop(StopReason.UNREADABLE, path, res))
            bad = checks[i]
            if bad is not None:
                return (loaded, nread, *self._stop(StopReason.CORRUPT, path, bad))
            loaded += 1
            nread += res.size
        return loaded, nread, StopReason.COMPLETE, ""

    def _buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialized host tensor of *shape*, reusing the pooled buffer when free.

        The tensor is a view of a numpy array, so the array's reference count says whether
        any tensor still uses it (the pool's reference plus getrefcount's own = 2).
        """
        nbytes = math.prod(shape) * self._itemsize
        with self._pool_lock:
            if self._pool is not None and self._pool.nbytes >= nbytes and sys.getrefcount(self._pool) == 2:
                arr = self._pool
            else:
                arr = np.empty(nbytes, dtype=np.uint8)
                if self.reuse_buffers:
                    self._pool = arr
            return torch.from_numpy(arr[:nbytes]).view(self.dtype).view(shape)

    def _fetch(self, digest: bytes, i: int, buf: torch.Tensor) -> int:
        """Read block *i* into its place in *buf* and validate it; returns bytes read.

        Raises FileNotFoundError, BlockCorrupt or another OSError.
        """
        T = self.namespace.tokens_per_block
        segs = [host_bytes(buf[l, kv, i * T : (i + 1) * T]) for l in range(buf.shape[0]) for kv in (0, 1)]
        header = bytearray(HEADER_LENGTH)
        size = HEADER_LENGTH + self._payload
        got = self._read_block(self.path(digest), header, segs, size)
        self._validate(header, segs, got, size, digest)
        return got

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._io_pool is None:
                self._io_pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="kvfs-prefix-read")
            return self._io_pool

    def close(self) -> None:
        """Stop the read threads and end the batch client's session if it opened one
        (a later call starts them again)."""
        with self._pool_lock:
            pool, self._io_pool = self._io_pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._agents is not None:
            self._agents.close()
        if self._mount is not None:
            self._mount.close()

    @staticmethod
    def _read_block(path: str, header: bytearray, segs: list[memoryview], size: int) -> int:
        fd = os.open(path, os.O_RDONLY)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise BlockCorrupt(f"file is {actual} bytes, expected {size}")
            return read_full(fd, [memoryview(header), *segs])
        finally:
            os.close(fd)

    def _validate(self, header: bytearray, segs: list[memoryview] | None, got: int, size: int, digest: bytes) -> None:
        """Raise :class:`BlockCorrupt` unless the block read is whole, of this namespace's
        layout, under its own name, and its payload (*segs*; None: checked elsewhere)
        matches the header's checksum."""
        if got != size:
            raise BlockCorrupt(f"short read: {got} of {size} bytes")
        h = decode_header(header)
        ns = self.namespace
        if (h.dtype, h.num_layers, h.num_kv_heads, h.head_size, h.tokens) != (
            ns.dtype,
            ns.num_layers,
            ns.num_kv_heads,
            ns.head_size,
            ns.tokens_per_block,
        ):
            raise BlockCorrupt("block layout does not match the namespace")
        if h.digest != digest[:16].ljust(16, b"\0"):
            raise BlockCorrupt("block is stored under another block's name")
        if segs is None:
            return
        x = xxhash.xxh3_64()
        for s in segs:
            x.update(s)
        if x.intdigest() != h.checksum:
            raise BlockCorrupt("payload checksum mismatch")

    @staticmethod
    def _drop(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a read-only or foreign directory: keep going, it is logged
            log.warning("prefix cache: could not remove invalid block %s: %s", path, exc)


# -- running a model with the prefix cache ----------------------------------------------


def cache_from_tensors(
    model: PreTrainedModel, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], tokens: int
) -> DynamicCache:
    """A cache for *model* whose layers are views of the first *tokens* tokens of *kv*
    (per layer ``(keys, values)`` shaped ``[1, heads, n, dim]``); nothing is copied.

    This is the "ideal" prefix cache: the KV already in process memory.
    """
    cache = _empty_cache(model)
    if tokens:
        for layer, (k, v) in zip(_dynamic_layers(cache), kv, strict=True):
            k, v = k[:, :, :tokens], v[:, :, :tokens]
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
    return cache


@torch.no_grad()
def prefill(
    model: PreTrainedModel,
    tokens: Sequence[int],
    prefix_cache: PrefixCache | None = None,
    *,
    cache: DynamicCache | None = None,
) -> Prefill:
    """Run the prompt *tokens* through *model*, computing only what is not cached.

    With *prefix_cache*, the longest cached prefix is loaded first (at most
    ``len(tokens) - 1`` tokens: the last token is always computed). With *cache* (a cache
    already holding a prefix of *tokens*, e.g. from :func:`cache_from_tensors`), that is
    used instead. Nothing is stored; call :meth:`PrefixCache.store` when you want to.
    """
    tokens = list(tokens)
    if not tokens:
        raise ValueError("prefill needs at least one token")
    device = next(model.parameters()).device
    hit = None
    if cache is None:
        if prefix_cache is not None:
            hit = prefix_cache.load(tokens, model, max_tokens=len(tokens) - 1, device=device)
            cache = hit.cache
        else:
            cache = _empty_cache(model)
    start = cache.get_seq_length()
    if start >= len(tokens):
        raise ValueError(f"the cache holds {start} tokens; the prompt has {len(tokens)}")
    ids = torch.tensor([tokens[start:]], dtype=torch.long, device=device)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return Prefill(logits=out.logits[0, -1].float(), cache=out.cache, cached_tokens=start, hit=hit)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokens: Sequence[int],
    max_new_tokens: int,
    prefix_cache: PrefixCache | None = None,
    *,
    store: bool = True,
) -> Generation:
    """Greedy generation of *max_new_tokens* tokens after *tokens*.

    Uses the longest cached prefix from *prefix_cache*; when *store* is true, the full
    blocks of the prompt are stored after the first token and those of prompt plus
    output at the end (everything whose KV the cache holds).
    """
    first = prefill(model, tokens, prefix_cache)
    cache = first.cache
    if prefix_cache is not None and store:
        prefix_cache.store(tokens, cache)
    logits = [first.logits]
    out = [int(first.logits.argmax())]
    device = next(model.parameters()).device
    while len(out) < max_new_tokens:
        ids = torch.tensor([[out[-1]]], dtype=torch.long, device=device)
        res = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        cache = res.cache
        logits.append(res.logits[0, -1].float())
        out.append(int(logits[-1].argmax()))
    if prefix_cache is not None and store and len(out) > 1:
        prefix_cache.store([*tokens, *out[:-1]], cache)
    return Generation(tokens=out, logits=logits, cached_tokens=first.cached_tokens)
