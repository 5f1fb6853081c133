"""Llama-architecture models with seeded random weights, built from a config (no downloads).

The prefix-cache tests and ``kvfs bench ttft`` need a real transformers model whose
attention, RoPE and KV layout are the ones production Llama models use, without fetching
weights. The weights are random but reproducible: the same preset and seed give the same
model in every process, and the model's name (which goes into the KV namespace) says both,
so blocks of two different random models never mix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("kvfs.gpu.random_llama needs torch and transformers: pip install 'kvfs[engines]'") from exc

__all__ = ["PRESETS", "Preset", "RandomModel", "build_model", "torch_dtype"]


class Preset(TypedDict):
    """The LlamaConfig keyword arguments a preset sets."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


# name -> LlamaConfig keyword arguments
PRESETS: dict[str, Preset] = {
    # For tests: runs a 100-token prefill in milliseconds.
    "tiny": {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    # ~31M parameters: the `--quick` benchmark on small machines.
    "small": {
        "vocab_size": 8192,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    # ~254M parameters, Llama-3.2-like GQA (16 layers, 8 KV heads of 64): the real benchmark.
    "250m": {
        "vocab_size": 32000,
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
    },
}

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """``"bf16"``/``"bfloat16"`` etc. to a torch dtype; ValueError names the choices."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}") from None


@dataclass(frozen=True, slots=True)
class RandomModel:
    model: LlamaForCausalLM
    name: str  # identifies the weights: goes into the KV namespace
    parameters: int


def build_model(
    preset: str = "tiny", *, dtype: torch.dtype = torch.float32, seed: int = 0, max_positions: int = 16384
) -> RandomModel:
    """A ``LlamaForCausalLM`` in eval mode with weights drawn from ``seed``.

    The weights are drawn in float32 and then cast, so the bf16 model of a seed is the
    fp32 model rounded. Raises ValueError for an unknown preset.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; expected one of {sorted(PRESETS)}")
    config = LlamaConfig(**PRESETS[preset], max_position_embeddings=max_positions, tie_word_embeddings=False)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(gen_state)
    # transformers declares PreTrainedModel.to with @wraps(torch.nn.Module.to), which mypy
    # reads as the unbound method (self first)
    model = model.to(dtype).eval()  # type: ignore[arg-type]
    params = sum(p.numel() for p in model.parameters())
    return RandomModel(model=model, name=f"kvfs-random-llama-{preset}-seed{seed}", parameters=params)
