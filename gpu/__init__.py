"""Engine-side kvfs: the GPU agent (:class:`kvfs.gpu.Agent`, docs/gpu.md) and the
transformers prefix cache. ``kvfs.gpu.Agent`` and ``kvfs.gpu.AgentConfig`` are imported
on first use, so that importing a torch-free module of this package (the KV block
format) does not import torch."""

from __future__ import annotations

from typing import Any

__all__ = ["Agent", "AgentConfig"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import agent

        return getattr(agent, name)
    raise AttributeError(f"module 'kvfs.gpu' has no attribute {name!r}")
