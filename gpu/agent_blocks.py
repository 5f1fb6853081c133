"""A prefix cache's blocks through the GPU agent, on a kvfs mount.

:class:`AgentBlocks` is the collaborator :class:`~kvfs.gpu.prefix_cache.PrefixCache` uses
for a load into a device: the agent (the one given, or one per device made on first use
over the mount's client), and the load itself: the blocks mapped through the agent (in
device memory, checked there, cached for the next request) and their KV copied into the
request's buffer on the device, in order, stopping at the first block that is missing or
invalid. The checks of what was read stay the prefix cache's (passed in as *validate*
and *stop*), the same as on its other paths.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from kvfs.errors import BlockCorrupt, BlockNotFound, KvfsError

from .agent import Agent, AgentConfig
from .mount_blocks import MountBlocks

__all__ = ["AgentBlocks"]

Validate = Callable[[bytearray, "list[memoryview] | None", int, int, bytes], None]
#: the caller's stop reasons (PrefixCache's StopReason)
R = TypeVar("R")


class AgentBlocks:
    """Loads of *mount*'s blocks into a device through *agent* (or agents of its own)."""

    def __init__(self, mount: MountBlocks, agent: Agent | None = None) -> None:
        self.mount = mount
        self.agent = agent
        self._own: dict[str, Agent] = {}
        self._lock = threading.Lock()

    def agent_for(self, device: torch.device | str | None) -> Agent | None:
        """The agent a load into *device* goes through: the one given, else one made for
        that device on first use; None without either."""
        if self.agent is not None:
            return self.agent
        if device is None:
            return None
        key = str(torch.device(device))
        with self._lock:
            agent = self._own.get(key)
            if agent is None:
                agent = self._own[key] = Agent(self.mount.client(), AgentConfig(device=key))
            return agent

    def load(
        self,
        agent: Agent,
        digests: Sequence[bytes],
        paths: Sequence[str],
        buf: torch.Tensor,
        *,
        header_length: int,
        size: int,
        validate: Validate,
        stop: Callable[[R, str, object], tuple[R, str]],
        reasons: tuple[R, R, R, R],
    ) -> tuple[int, int, R, str]:
        """Map the blocks and copy each one's KV into ``buf[:, :, i*T:(i+1)*T]`` (*buf*:
        ``[layers, 2, tokens, heads, dim]`` on the agent's device): ``(blocks accepted,
        bytes, why it stopped, detail)``. *reasons*: the stop reasons for (complete,
        missing, corrupt, unreadable). The KV header is checked on the host (4 KiB back);
        the payload's own checksum only where the block is host memory: on a GPU the
        agent's check of kvfs's checksum covers the bytes."""
        complete, missing, corrupt, unreadable = reasons
        L, T = buf.shape[0], buf.shape[2] // max(len(digests), 1)
        names = self.mount.names(digests)
        loading = agent.load_async(names)
        loaded = nread = 0
        for i, ev in enumerate(loading.events):
            try:
                t = ev.wait()
            except BlockNotFound:
                return (loaded, nread, *stop(missing, paths[i], "no such block"))
            except BlockCorrupt as exc:
                return (loaded, nread, *stop(corrupt, paths[i], exc))
            except KvfsError as exc:
                return (loaded, nread, *stop(unreadable, paths[i], exc))
            try:
                if t.numel() != size:
                    raise BlockCorrupt(f"block is {t.numel()} bytes, expected {size}")
                header = bytearray(t[:header_length].cpu().numpy().tobytes())
                payload = t[header_length:size]
                segs = [payload.numpy().data.cast("B")] if payload.device.type == "cpu" else None
                validate(header, segs, size, size, digests[i])
            except BlockCorrupt as exc:
                agent.evict([names[i]])
                return (loaded, nread, *stop(corrupt, paths[i], exc))
            buf[:, :, i * T : (i + 1) * T].copy_(payload.view(buf.dtype).view(L, 2, T, *buf.shape[3:]))
            loaded += 1
            nread += size
        return loaded, nread, complete, ""

    def close(self) -> None:
        """Close the agents made here (an agent given stays the caller's)."""
        with self._lock:
            agents, self._own = list(self._own.values()), {}
        for a in agents:
            a.close()
