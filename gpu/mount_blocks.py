"""A prefix cache's blocks on a kvfs mount, through the batch client.

:class:`MountBlocks` is the collaborator :class:`~kvfs.gpu.prefix_cache.PrefixCache`
uses when its directory is on a kvfs mount: the blocks' names inside the mount, whether
they are present (one lookup), reading them into the load buffer (one lease round trip,
the bytes out of the DRAM arena or straight from the disk tier's files) and writing them
(straight into reserved arena extents, each with its chain parent). It connects on first
use: for writing when the mount has a DRAM arena, else read-only (the cache then writes
files). The checks of what was read stay the prefix cache's: the same as on the file path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kvfs.client import BatchError, Client, Read
from kvfs.errors import KvfsError
from kvfs.hashing import HashFn, Namespace, block_path

__all__ = ["MountBlocks"]

log = logging.getLogger(__name__)

Block = tuple[int, bytes, list[memoryview]]  # (position in the chain, digest, segments)


class MountBlocks:
    """The blocks of *namespace* under *base* (the cache directory's name inside the
    mount at *mountpoint*, or, with *client* given, whatever *path_of* says)."""

    def __init__(
        self,
        namespace: Namespace,
        hash_fn: HashFn,
        *,
        mountpoint: str | None = None,
        base: str = "",
        client: Client | None = None,
        path_of: Callable[[bytes], str] | None = None,
        io_threads: int = 4,
    ) -> None:
        if client is None and mountpoint is None:
            raise ValueError("MountBlocks needs a mountpoint or a client")
        self.namespace = namespace
        self.hash_fn = hash_fn
        self.mountpoint = mountpoint
        self.base = base
        self.path_of = path_of
        self.io_threads = io_threads
        self._client = client
        self._own = False
        self.puts = True  # known once connected: False when the mount takes no client puts
        self._lock = threading.Lock()

    def client(self) -> Client:
        """The client, connected on first use (for writing where the mount has an arena)."""
        with self._lock:
            if self._client is None:
                assert self.mountpoint is not None
                kw: dict[str, Any] = {"name": "kvfs prefix cache", "io_threads": self.io_threads}
                try:
                    self._client = Client(self.mountpoint, write=True, **kw)
                except KvfsError:  # no DRAM tier, or puts not allowed here
                    self._client = Client(self.mountpoint, **kw)
                    self.puts = False
                self._own = True
            return self._client

    def names(self, digests: Sequence[bytes]) -> list[str]:
        """The block names (paths inside the mount) of *digests*."""
        if self.mountpoint is None:
            assert self.path_of is not None and self._client is not None
            return [self._client.name_of(self.path_of(d)) for d in digests]
        rel = [block_path(self.namespace, d, self.hash_fn) for d in digests]
        return [f"{self.base}/{r}" if self.base else r for r in rel]

    def prefix(self, digests: Sequence[bytes]) -> int:
        """How many leading blocks of the chain are present (one round trip)."""
        return self.client().lookup(self.names(digests)).prefix

    def present(self, digests: Sequence[bytes]) -> list[bool]:
        found = self.client().lookup(self.names(digests))
        return [found.present(i) for i in range(len(digests))]

    def read(
        self, digests: Sequence[bytes], segs: list[list[memoryview]], then: Callable[[int, Read], object]
    ) -> list[Read | KvfsError]:
        """Each block into its segments; per block a :class:`Read` or the error it met
        (*then* runs as each lands). A failure of the whole call raises."""
        try:
            return list(self.client().read_into(self.names(digests), segs, then=then))
        except BatchError as exc:
            return exc.results

    def put(self, blocks: list[Block], digests: Sequence[bytes]) -> tuple[list[Block], int, int]:
        """Put *blocks* straight into the arena, each with its chain parent; returns the
        blocks it could not put (to write as files), and the count and bytes it wrote."""
        names = self.names(digests)
        todo = [names[i] for i, _, _ in blocks]
        parents = [names[i - 1] if i else None for i, _, _ in blocks]
        try:
            self.client().put(todo, [segs for _, _, segs in blocks], parents=parents)
            failed: set[int] = set()
        except BatchError as exc:
            failed = set(exc.errors)
        except KvfsError as exc:  # no room in the arena for the batch: write them as files
            log.info("prefix cache: the batch client could not put %d blocks (%s); writing files", len(blocks), exc)
            return blocks, 0, 0
        put = [b for k, b in enumerate(blocks) if k not in failed]
        return (
            [b for k, b in enumerate(blocks) if k in failed],
            len(put),
            sum(sum(len(s) for s in segs) for _, _, segs in put),
        )

    def close(self) -> None:
        """End the session if this opened it (a later call opens another)."""
        with self._lock:
            client, self._client = (self._client, None) if self._own else (None, self._client)
            self._own = False
        if client is not None:
            client.close()
