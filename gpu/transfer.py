"""How the GPU agent lands a block's bytes in its device buffer, by where the block is.

- **arena** (:class:`ArenaCopier`): the DRAM tier's shared-memory arena, mapped by the
  client, is wrapped once as a uint8 tensor; with CUDA it is registered as pinned memory
  (``cudaHostRegister`` through ``torch.cuda.cudart()``, read-only for a read session) and
  copied with ``non_blocking=True`` on a side stream, i.e. DMA from the leased extent.
- **disk** (a :class:`FileLoader`): a block file's payload at its 4 KiB-aligned offset
  (the lease's ``path``/``offset``/``length``), read by

  - ``"kvikio"`` (:class:`KvikioLoader`): ``kvikio.CuFile.pread`` straight into device
    memory (GPUDirect Storage where the driver has it, kvikio's compat mode otherwise);
  - ``"nixl"`` (:class:`NixlLoader`): a NIXL agent (:mod:`kvfs.nixl`) with the
    ``GDS_MT``/``GDS`` backend into VRAM, or ``POSIX`` into registered host memory, the
    file registered as FILE memory (its descriptor, the payload's offset and length);
  - ``"posix"`` (:class:`PosixLoader`): ``preadv`` into the host buffer, or into pinned
    staging and copied to the device.

  :func:`open_loader` makes the one a config names; ``"auto"`` probes once (kvikio, then
  NIXL, then POSIX) and never fails for lack of a feature: POSIX reads always work.

Nothing here checks the bytes: the agent verifies every block it landed
(:mod:`kvfs.gpu.integrity`) before it counts as loaded. kvikio is imported only when it is
asked for (it needs ``libcuda.so.1`` even for host buffers), NIXL only when it is probed.
"""

from __future__ import annotations

import abc
import errno
import logging
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvfs.client.buffers import read_file
from kvfs.errors import BlockCorrupt, KvfsError, NixlUnavailable, TransferFailed
from kvfs.nixl import Agent, Backend, Registration

from .host_io import host_bytes

__all__ = [
    "TRANSFERS",
    "ArenaCopier",
    "FileLoader",
    "Item",
    "KvikioLoader",
    "NixlLoader",
    "PosixLoader",
    "TransferUnavailable",
    "cuda_missing",
    "open_loader",
]

log = logging.getLogger(__name__)

TRANSFERS = ("auto", "kvikio", "nixl", "posix")
_CUDA_HOST_REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly: the arena of a read session is PROT_READ


class TransferUnavailable(KvfsError):
    """The transfer a config names cannot work here (no CUDA, no kvikio, no NIXL backend)."""


def cuda_missing() -> str | None:
    """Why CUDA cannot be used here, or None when a CUDA device is present."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return "no CUDA device" if built else "no CUDA device (this torch is built without CUDA)"
    return None


@dataclass(frozen=True, slots=True)
class Item:
    """One block to land: *length* bytes at *offset* of the file *path* into *dest* (a
    contiguous uint8 tensor on the agent's device, at least *length* long)."""

    path: str
    offset: int
    length: int
    dest: torch.Tensor


class FileLoader(abc.ABC):
    """Reads block files' payloads into device (or host) tensors."""

    name: str

    @abc.abstractmethod
    def read(self, items: Sequence[Item], stream: Any = None) -> list[BaseException | None]:
        """Land every item; per item None or the error it met. The bytes are not verified.
        With CUDA, copies are ordered on *stream* and done when this returns."""

    def close(self) -> None:
        """Give back what the loader holds (registrations, handles)."""


class PosixLoader(FileLoader):
    """``preadv`` into the host tensor, or into pinned staging then to the device."""

    name = "posix"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._staging: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def _stage(self, n: int) -> torch.Tensor:
        with self._lock:
            for i, t in enumerate(self._staging):
                if t.numel() >= n:
                    return self._staging.pop(i)[:n]
        return torch.empty(n, dtype=torch.uint8, pin_memory=True)

    def _unstage(self, t: torch.Tensor) -> None:
        base = t._base if t._base is not None else t
        with self._lock:
            if len(self._staging) < 8:
                self._staging.append(base)

    def read(self, items: Sequence[Item], stream: Any = None) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        staged: list[torch.Tensor] = []
        try:
            for it in items:
                host = it.dest[: it.length] if it.dest.device.type == "cpu" else self._stage(it.length)
                try:
                    got = read_file(it.path, it.offset, it.length, [host_bytes(host)])
                except OSError as exc:
                    out.append(BlockCorrupt(f"reading {it.path} failed: {exc}"))
                    continue
                if got != it.length:
                    out.append(BlockCorrupt(f"short read of {it.path} ({got} of {it.length} bytes)"))
                    continue
                if host is not it.dest and host.data_ptr() != it.dest.data_ptr():
                    with torch.cuda.stream(stream):
                        it.dest[: it.length].copy_(host, non_blocking=True)
                    staged.append(host)
                out.append(None)
        finally:
            if staged:
                (stream or torch.cuda.current_stream()).synchronize()
                for t in staged:
                    self._unstage(t)
        return out


class NixlLoader(FileLoader):
    """NIXL (a :class:`kvfs.nixl.Agent`, the plumbing the daemon's peer tier uses too): the
    block files registered as FILE memory, the destinations as DRAM (the ``POSIX``
    backend) or VRAM (``GDS_MT``, else ``GDS``); one transfer per batch, which may take at
    most *timeout* seconds."""

    def __init__(self, device: torch.device, backends: Sequence[str] | None = None, *, timeout: float = 60.0) -> None:
        self.device = device
        self.mem = "DRAM" if device.type == "cpu" else "VRAM"
        self.timeout = timeout
        wanted = list(backends or (["POSIX"] if device.type == "cpu" else ["GDS_MT", "GDS"]))
        try:
            self._agent: Agent | None = Agent(f"kvfs-{os.getpid()}-{id(self):x}")
        except NixlUnavailable as exc:
            raise TransferUnavailable(str(exc)) from None
        errors = []
        self._backend: Backend | None = None
        for b in wanted:
            if b not in self._agent.plugins:
                errors.append(f"{b}: no plugin")
                continue
            try:
                backend = self._agent.backend(b)
            except NixlUnavailable as exc:  # reported, next backend
                errors.append(f"{b}: {exc}")
                continue
            if {"FILE", self.mem} <= backend.mems:
                self._backend = backend
                break
            errors.append(f"{b}: cannot move FILE to {self.mem} ({', '.join(sorted(backend.mems))})")
        if self._backend is None:
            raise TransferUnavailable(f"no NIXL backend can read files into {self.mem}: {'; '.join(errors)}")
        self.backend = self._backend.kind
        self.name = f"nixl-{self.backend.lower().replace('_', '-')}"
        self._lock = threading.Lock()  # one batch's registrations at a time

    def _open(self, path: str) -> int:
        """The file for a transfer: with ``O_DIRECT`` for the GDS backends (cuFile moves
        data straight to the GPU only for such descriptors; payloads are 4 KiB-aligned),
        plainly where the filesystem refuses it and for POSIX."""
        flags = os.O_RDONLY | os.O_CLOEXEC
        if self.backend.startswith("GDS"):
            try:
                return os.open(path, flags | getattr(os, "O_DIRECT", 0))
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
        return os.open(path, flags)

    def read(self, items: Sequence[Item], stream: Any = None) -> list[BaseException | None]:
        if not items:
            return []
        a, backend = self._agent, self._backend
        if a is None or backend is None:
            raise TransferUnavailable("this NIXL loader is closed")
        out: list[BaseException | None] = [None] * len(items)
        fds: list[int] = []
        dev = (self.device.index or 0) if self.device.type == "cuda" else 0
        with self._lock:
            regs: list[Registration] = []
            try:
                for i, it in enumerate(items):
                    if it.length == 0:  # nothing to move (NIXL refuses empty descriptors)
                        fds.append(-1)
                        continue
                    try:
                        fds.append(self._open(it.path))
                    except OSError as exc:
                        out[i] = BlockCorrupt(f"opening {it.path} failed: {exc}")
                        fds.append(-1)
                live = [i for i in range(len(items)) if out[i] is None and fds[i] >= 0]
                if not live:
                    return out
                mem = [(items[i].dest.data_ptr(), items[i].length, dev) for i in live]
                files = [(items[i].offset, items[i].length, fds[i]) for i in live]
                regs.append(a.register(self.mem, mem, backend))
                regs.append(a.register("FILE", files, backend))
                a.transfer(  # spun: the backend moves only while its status is checked
                    "READ",
                    mem,
                    files,
                    backend=backend,
                    timeout=self.timeout,
                    local_mem=self.mem,
                    remote_mem="FILE",
                    spin=self.timeout,
                )
            except (NixlUnavailable, TransferFailed) as exc:  # a registration or request NIXL refused: each item fails
                for i in range(len(items)):
                    if out[i] is None and fds[i] >= 0:
                        out[i] = BlockCorrupt(f"the NIXL {self.backend} read of {items[i].path} failed: {exc}")
            finally:
                for reg in reversed(regs):
                    a.deregister(reg)
                for fd in fds:
                    if fd >= 0:
                        os.close(fd)
        return out

    def close(self) -> None:
        self._agent = None


class KvikioLoader(FileLoader):
    """kvikio ``CuFile.pread`` straight into device memory at the payload offset: GDS
    where present, kvikio's compat mode (POSIX reads through its bounce buffers) else."""

    def __init__(self, device: torch.device) -> None:
        why = cuda_missing()
        if device.type != "cuda" or why:
            raise TransferUnavailable(f"kvikio reads into CUDA memory and needs libcuda.so.1: {why or 'device is cpu'}")
        try:
            import kvikio
            import kvikio.defaults
        except (ImportError, OSError, RuntimeError) as exc:
            raise TransferUnavailable(f"kvikio is not usable (pip install kvikio-cu12, the gds extra): {exc}") from None
        self._kvikio = kvikio
        self.device = device
        compat = _kvikio_compat(kvikio)
        self.name = "kvikio-compat" if compat else "kvikio-gds"

    def read(self, items: Sequence[Item], stream: Any = None) -> list[BaseException | None]:
        out: list[BaseException | None] = [None] * len(items)
        if stream is not None:
            stream.synchronize()  # earlier copies into these buffers are done first
        pending = []
        for i, it in enumerate(items):
            try:
                f = self._kvikio.CuFile(it.path, "r")
            except (OSError, RuntimeError) as exc:
                out[i] = BlockCorrupt(f"opening {it.path} failed: {exc}")
                continue
            pending.append((i, f, f.pread(it.dest[: it.length], it.length, it.offset)))
        for i, f, fut in pending:
            try:
                got = fut.get()
                if got != items[i].length:
                    out[i] = BlockCorrupt(f"short read of {items[i].path} ({got} of {items[i].length} bytes)")
            except (OSError, RuntimeError) as exc:
                out[i] = BlockCorrupt(f"the kvikio read of {items[i].path} failed: {exc}")
            finally:
                f.close()
        return out


def _kvikio_compat(kvikio: Any) -> bool:
    d = kvikio.defaults
    for attr in ("is_compat_mode_preferred", "compat_mode"):
        fn = getattr(d, attr, None)
        if fn is not None:
            try:
                return bool(fn()) if attr == "is_compat_mode_preferred" else str(fn()).upper().endswith("ON")
            except (RuntimeError, TypeError, ValueError) as exc:
                log.info("kvikio: %s() failed (%s); assuming compat mode", attr, exc)
    return True


def open_loader(transfer: str, device: torch.device) -> tuple[FileLoader, list[str]]:
    """The loader *transfer* names for *device*, and why the ones ``auto`` passed over
    could not be used. An explicit choice that cannot work raises
    :class:`TransferUnavailable` saying why; ``auto`` falls back to POSIX reads."""
    if transfer not in TRANSFERS:
        raise ValueError(f"transfer must be one of {', '.join(TRANSFERS)} (got {transfer!r})")
    if transfer == "posix":
        return PosixLoader(device), []
    if transfer == "kvikio":
        return KvikioLoader(device), []
    if transfer == "nixl":
        return NixlLoader(device), []
    passed: list[str] = []
    order = (KvikioLoader, NixlLoader) if device.type == "cuda" else (NixlLoader,)
    for cls in order:
        try:
            return cls(device), passed
        except TransferUnavailable as exc:
            passed.append(f"{cls.__name__}: {exc}")
    return PosixLoader(device), passed


class ArenaCopier:
    """Copies leased extents of the client's arena into device (or host) tensors. With
    CUDA the whole arena is registered once as pinned memory, so each copy is a DMA
    issued on the caller's side stream."""

    def __init__(self, arena: memoryview | None, device: torch.device, *, writable: bool) -> None:
        self.device = device
        self.registered = False
        self._tensor: torch.Tensor | None = None
        self._view = arena
        self._ptr = 0
        if arena is None or len(arena) == 0:
            return
        with warnings.catch_warnings():  # a read session's arena is read-only: never written through here
            warnings.simplefilter("ignore", UserWarning)
            self._tensor = torch.frombuffer(arena, dtype=torch.uint8)
        self._ptr = self._tensor.data_ptr()
        if device.type == "cuda":
            flags = 0 if writable else _CUDA_HOST_REGISTER_READ_ONLY
            err = torch.cuda.cudart().cudaHostRegister(self._ptr, len(arena), flags)
            self.registered = int(err) == 0
            if not self.registered:  # still correct, through a staging copy inside the driver
                log.warning("kvfs gpu: cudaHostRegister of the arena failed (%s); copies are not DMA", err)

    def source(self, offset: int, length: int) -> torch.Tensor:
        """The leased extent as a host tensor (valid while the lease is)."""
        if self._tensor is None:
            raise KvfsError("the client has no DRAM arena to copy from")
        return self._tensor[offset : offset + length]

    def copy(self, offset: int, length: int, dest: torch.Tensor, stream: Any = None) -> None:
        src = self.source(offset, length)
        if dest.device.type == "cpu":  # a memcpy: torch's threaded CPU copy is slower on a busy host
            assert self._view is not None
            host_bytes(dest[:length])[:] = self._view[offset : offset + length]
            return
        with torch.cuda.stream(stream):
            dest[:length].copy_(src, non_blocking=self.registered)

    def close(self) -> None:
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self._ptr)
            self.registered = False
        self._tensor = None
        self._view = None
