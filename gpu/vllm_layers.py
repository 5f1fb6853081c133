"""Layer-wise loads and saves for :class:`kvfs.gpu.vllm_connector.KvfsConnector`.

vLLM calls the connector's ``wait_for_layer_load(layer)`` before each attention layer and
``save_kv_layer(layer)`` after it. With ``kvfs_layerwise`` on, a step's loads and saves
go a layer at a time, so that layer k's attention runs while layer k+1's KV is copied in,
and layer k's KV is copied out while layer k+1 runs:

- :class:`LayerLoads`: one lease of every block of the step (``Client.lease`` with
  ``promote="always"``: DRAM copies; a block the DRAM tier could not take is read whole
  from its disk-tier file and verified), each block's size and header checked, in the
  caller (``start_load_kv``); then a background thread copies each layer's slice of
  every good block into the paged KV tensor, in layer order, and ``wait_for_layer_load``
  copies a layer itself when the thread has not taken it yet (on a busy machine the
  thread may not run for a while: the forward never waits for it to be scheduled). With
  ``kvfs_verify`` a DRAM copy's checksum is taken after the last layer is copied: a bad
  block is reported with the step's load errors, and vLLM drops what the step computed
  for its request and recomputes it (``get_block_ids_with_load_errors``, as for any
  failed block).
- :class:`LayerSaves`: one reservation of every block the step completes (taken when the
  step starts), each block's header written, each layer's slice copied into the arena
  as soon as its attention ran, and the commit sent once every layer is in (the step's
  ``wait_for_save`` waits for the copies, not for the commit, which the next step's
  first call waits for).

A block is the connector's: a header, then each layer's block (``[2, ...]`` layouts as K
then V) in order (:class:`BlockLayout`). Copies are numpy copies between the arena
mapping and the paged tensor's own memory, which release the GIL, so the thread runs
beside the model's compute. KV in host memory only (vLLM on CPU); on a GPU the connector
loads whole steps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from kvfs.client import BatchError, Client, Hold, PutBuffer, buffers
from kvfs.errors import KvfsError

__all__ = ["BlockLayout", "LayerLoads", "LayerSaves"]

logger = logging.getLogger("vllm.kvfs_connector")


def _host_bytes(t: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's bytes as a flat uint8 array (its own memory, no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()


@dataclass(frozen=True)
class BlockLayout:
    """Where each layer of block *b* lives: in the block (``offsets``, ``sizes``, after a
    ``header`` of that many bytes) and in the paged KV (``parts[layer]``: arrays of shape
    ``[num_blocks, bytes]`` over the tensors' own memory, in block order)."""

    header: int
    parts: list[list[np.ndarray]]
    offsets: list[int]
    sizes: list[int]

    @property
    def block_bytes(self) -> int:
        return self.header + sum(self.sizes)

    @classmethod
    def of(cls, header: int, layer_parts: list[list[torch.Tensor]], num_blocks: int) -> BlockLayout:
        """From each layer's block-dimension tensors (``t`` of ``[num_blocks, ...]``, or
        ``t[0]`` and ``t[1]`` of a ``[2, num_blocks, ...]`` layout), in host memory."""
        parts: list[list[np.ndarray]] = []
        offsets, sizes = [], []
        at = header
        for tensors in layer_parts:
            arrays = [_host_bytes(t).reshape(num_blocks, -1) for t in tensors]
            parts.append(arrays)
            offsets.append(at)
            n = sum(a.shape[1] for a in arrays)
            sizes.append(n)
            at += n
        return cls(header=header, parts=parts, offsets=offsets, sizes=sizes)

    def segments(self, block_id: int) -> list[np.ndarray]:
        """Block *block_id*'s bytes in the paged KV, every layer in order."""
        return [a[block_id] for arrays in self.parts for a in arrays]


class _Events:
    """One event per layer, plus the thread's end."""

    def __init__(self, n: int) -> None:
        self.layers = [threading.Event() for _ in range(n)]
        self.done = threading.Event()

    def release_all(self) -> None:
        for e in self.layers:
            e.set()
        self.done.set()


class LayerLoads:
    """The loads of one step, layer by layer (module docstring). *check(i, header_bytes)*
    says whether block *i*'s header is the one expected.

    The lease and the blocks' checks run in the caller (``start_load_kv``: one round
    trip); then a thread copies the layers in order, and so does the forward: a
    ``wait(k)`` whose layer nobody took yet copies it (and the ones before it) itself.
    The forward never waits for a thread that is not running: on a busy machine a
    thread woken per layer costs a scheduling round each (measured: 8 layers, load 10 on
    2 cores, +150 ms of TTFT), while a thread that does run copies ahead of the forward."""

    def __init__(
        self,
        client: Client,
        layout: BlockLayout,
        names: list[str],
        block_ids: list[int],
        check: Callable[[int, bytes], bool],
        *,
        verify: bool,
    ) -> None:
        self.client = client
        self.layout = layout
        self.names = names
        self.block_ids = block_ids
        self._check = check
        self.verify = verify
        self.failed: dict[int, str] = {}  # position -> why
        self._dram: set[int] = set()  # positions read from a DRAM (or copy-buffer) copy
        self.loaded = 0
        self.waited = 0  # layers vLLM waited for (each attention layer, in a normal step)
        self.copied_here = 0  # layers the forward copied itself (the thread had not taken them)
        self.started = time.perf_counter()
        self.seconds = 0.0
        n = len(layout.parts)
        self._events = _Events(n)
        self._lock = threading.Lock()
        self._next = 0  # the first layer nobody took yet
        self._holds: list[Any] = []
        self._good: list[tuple[int, np.ndarray, int]] = []
        try:
            self._holds = self._lease()
            self._good = self._checked(self._holds)
        except Exception as exc:  # noqa: BLE001  (a failed load is a recompute, never an error of the step)
            self._fail(exc)
            self._next = n
        self._thread = threading.Thread(target=self._run, name="kvfs-layer-loads", daemon=True)
        self._thread.start()

    def wait(self, layer: int) -> None:
        """Until layer *layer* of every block is in the paged KV (or given up on): copied
        here if nobody took it yet."""
        self.waited += 1
        while (k := self._take(layer)) is not None:
            self._copy(k)
            self.copied_here += 1
        self._events.layers[layer].wait()

    def join(self) -> None:
        self._events.done.wait()
        self._thread.join()

    def _take(self, upto: int | None = None) -> int | None:
        """The next layer nobody took (at most *upto*), now taken; None if none."""
        with self._lock:
            k = self._next
            if k >= len(self.layout.parts) or (upto is not None and k > upto):
                return None
            self._next = k + 1
            return k

    def _copy(self, k: int) -> None:
        """Layer *k* of every good block into the paged KV; its event set."""
        try:
            lay = self.layout
            arrays, off = lay.parts[k], lay.offsets[k]
            for i, src, base in self._good:
                b = self.block_ids[i]
                at = base + off
                for a in arrays:
                    n = a.shape[1]
                    np.copyto(a[b], src[at : at + n])
                    at += n
        except Exception as exc:  # noqa: BLE001  (every block is then recomputed)
            self._fail(exc)
        finally:
            self._events.layers[k].set()

    def _fail(self, exc: Exception) -> None:
        logger.warning("kvfs: layer-wise load of %d blocks failed: %s", len(self.names), exc)
        for i in range(len(self.names)):
            self.failed.setdefault(i, f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        holds = self._holds
        try:
            while (k := self._take()) is not None:
                self._copy(k)
            for e in self._events.layers:  # the forward may still be copying the last ones
                e.wait()
            # a DRAM copy's checksum, taken once every layer is copied (from the leased
            # extent, which nothing rewrites while leased): a block found bad is reported
            # with the step's load errors, and vLLM drops what the step computed for its
            # request and recomputes it, as for any failed block
            size = self.layout.block_bytes
            for i, src, base in self._good:
                if self._streamed(i) and xxhash.xxh3_64_intdigest(src[base : base + size].data) != holds[i].checksum:
                    self.client.suspect(holds[i], "its DRAM copy does not match the block's checksum")
                    self.failed[i] = "its DRAM copy does not match the block's checksum"
            self.loaded = sum(1 for i, _, _ in self._good if i not in self.failed)
        except Exception as exc:  # noqa: BLE001  (the thread must end and say why: the forward waits on it)
            self._fail(exc)
            self.loaded = 0
        finally:
            self.seconds = time.perf_counter() - self.started
            self._events.release_all()
            live = [h for h in holds if isinstance(h, Hold) and not h.released]
            if live:
                try:
                    self.client.release(live)
                except KvfsError:
                    pass  # the session is gone: so are its leases

    def _lease(self) -> list[Any]:
        try:
            return list(self.client.lease(self.names, promote="always"))
        except BatchError as exc:
            for i, r in exc.errors.items():
                self.failed[i] = f"{type(r).__name__}: {r}"
            return list(exc.results)

    def _checked(self, holds: list[Any]) -> list[tuple[int, np.ndarray, int]]:
        """The blocks that may be copied, each with the bytes to copy from and where in
        them it starts: a DRAM (or copy-buffer) copy in the arena mapping, or a disk
        tier's file (the DRAM tier could not take it) read whole and verified; each of
        exactly a block's size, with this engine's header and (DRAM copies with
        *verify*; files always) the block's checksum."""
        lay = self.layout
        view = self.client.arena
        arena = np.frombuffer(view, dtype=np.uint8) if view is not None else None
        good: list[tuple[int, np.ndarray, int]] = []
        for i, h in enumerate(holds):
            if i in self.failed or not isinstance(h, Hold):
                continue
            if h.length != lay.block_bytes:
                self.failed[i] = f"{h.length} bytes, not {lay.block_bytes}"
                continue
            if h.kind == "file":
                src = np.empty(h.length, np.uint8)
                try:
                    got = buffers.read_file(h.path, h.offset, h.length, [src.data])
                except OSError as exc:
                    self.failed[i] = f"reading its block file failed: {exc}"
                    continue
                if got != h.length or xxhash.xxh3_64_intdigest(src.data) != h.checksum:
                    self.client.suspect(h, "its block file does not match the block's checksum")
                    self.failed[i] = "its block file does not match the block's checksum"
                    continue
                base = 0
            else:
                assert arena is not None
                src, base = arena, h.offset
            if not self._check(i, src[base : base + lay.header].tobytes()):
                self.failed[i] = "a foreign header (another block's bytes under this name)"
            else:
                if h.kind != "file":
                    self._dram.add(i)
                good.append((i, src, base))
        return good

    def _streamed(self, i: int) -> bool:
        """Whether block *i*'s checksum is taken as it is copied (a DRAM copy, with verify)."""
        return self.verify and i in self._dram


class LayerSaves:
    """The saves of one step, layer by layer in a thread (module docstring). *heads[i]*
    is block *i*'s header."""

    def __init__(
        self,
        client: Client,
        layout: BlockLayout,
        names: list[str],
        block_ids: list[int],
        heads: list[bytes],
        parents: list[str | None],
        after: LayerSaves | None = None,
    ) -> None:
        self.client = client
        self.layout = layout
        self.names = names
        self.block_ids = block_ids
        self.saved = 0
        self.failed = 0
        self.handed = 0  # layers vLLM handed over as their attention ran
        self.started = time.perf_counter()
        self.seconds = 0.0
        self._todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._copied = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(heads, parents, after), name="kvfs-layer-saves", daemon=True
        )
        self._thread.start()

    def layer(self, k: int) -> None:
        """Layer *k*'s attention ran: its KV in the saved blocks is final."""
        self.handed += 1
        self._todo.put(k)

    def finish(self) -> None:
        """Every layer in (those not handed over yet are copied now); the commit goes
        out in the thread. Returns once nothing reads the paged KV any more."""
        self._todo.put(None)
        self._copied.wait()

    def join(self) -> None:
        """Until the commit was answered."""
        self._done.wait()
        self._thread.join()

    def _run(self, heads: list[bytes], parents: list[str | None], after: LayerSaves | None) -> None:
        puts: list[Any] = []
        copied: set[int] = set()
        try:
            if after is not None:
                after.join()  # one step's commit before the next step's reservation
            try:
                puts = list(self.client.reserve(self.names, [self.layout.block_bytes] * len(self.names), parents))
            except BatchError as exc:
                puts = list(exc.results)
                self.failed += len(exc.errors)
            lay = self.layout
            dests = []
            for i, p in enumerate(puts):
                if isinstance(p, PutBuffer):
                    d = np.frombuffer(p.data, dtype=np.uint8)
                    d[: lay.header] = np.frombuffer(heads[i], dtype=np.uint8)
                    dests.append((d, self.block_ids[i]))
            while True:
                k = self._todo.get()
                if k is None:
                    break
                self._copy(k, dests)
                copied.add(k)
            for k in range(len(lay.parts)):  # layers vLLM did not hand over (none in a normal step)
                if k not in copied:
                    self._copy(k, dests)
        except Exception as exc:  # noqa: BLE001  (the thread must end and say why: the forward waits on it)
            logger.warning("kvfs: layer-wise save of %d blocks failed: %s", len(self.names), exc)
            self.failed = len(self.names)
            live = [p for p in puts if isinstance(p, PutBuffer)]
            puts = []
            if live:
                try:
                    self.client.abort(live)
                except KvfsError:
                    pass
        finally:
            self._copied.set()
        try:
            live = [p for p in puts if isinstance(p, PutBuffer)]
            if live:
                errors = self.client.commit(live)
                bad = sum(e is not None for e in errors)
                self.failed += bad
                self.saved = len(live) - bad
                if bad:
                    first = next(e for e in errors if e is not None)
                    logger.warning("kvfs: %d of %d blocks not saved: %s", bad, len(live), first)
        except KvfsError as exc:
            logger.warning("kvfs: commit of %d blocks failed: %s", len(puts), exc)
            self.failed = len(self.names)
            self.saved = 0
        finally:
            self.seconds = time.perf_counter() - self.started
            self._done.set()

    def _copy(self, k: int, dests: list[tuple[np.ndarray, int]]) -> None:
        lay = self.layout
        for d, b in dests:
            at = lay.offsets[k]
            for a in lay.parts[k]:
                n = a.shape[1]
                np.copyto(d[at : at + n], a[b])
                at += n
