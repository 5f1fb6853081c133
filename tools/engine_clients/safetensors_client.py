"""safetensors ``save_file``/``load_file`` and transformers ``save_pretrained`` on a directory.

Runs in kvfs's own environment (safetensors >= 0.8 and transformers >= 5 come with the
``engines`` extra), by path, like the other clients. safetensors >= 0.8 writes a file as
``openat(DIR/.tmpXXXX, O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC, 0600)``, ``ftruncate``, ``write``,
then ``renameat`` onto the final name *while the file is still open* (``unlink`` of the
temp name on error), then ``close``; ``load_file`` maps the file (mmap).

Steps: ``save_file`` of tensors of several dtypes with metadata; ``load_file`` and
``safe_open`` (mmap, one slice) compared with what was saved; ``save_file`` again onto the
same name (a replacement); transformers ``save_pretrained`` of a tiny random Llama, then
``from_pretrained`` and the state dicts compared; ``save_pretrained`` again into the same
directory.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from client_report import emit, step, timed, tree


def _tensors(seed: int, tokens: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "kv_cache": torch.randn(2, tokens, 2, 64, generator=g).to(torch.bfloat16),
        "f32": torch.randn(1000, generator=g),
        "f16": torch.randn(33, 17, generator=g).to(torch.float16),
        "ids": torch.arange(0, 4096, dtype=torch.int64),
    }


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--part", choices=["safetensors", "transformers", "all"], default="all")
    parser.add_argument("--tokens", type=int, default=96, help="tokens of the KV tensor saved (512 bytes each)")
    args = parser.parse_args()

    import safetensors
    import transformers

    os.makedirs(args.dir, exist_ok=True)
    times: dict[str, float] = {}
    r: dict[str, Any] = {
        "safetensors": safetensors.__version__,
        "transformers": transformers.__version__,
        "times": times,
    }
    if args.part in ("safetensors", "all"):
        _safetensors_steps(args.dir, args.tokens, r, times)
    if args.part in ("transformers", "all"):
        _transformers_steps(args.dir, r, times)
    r["tree"] = tree(args.dir)
    emit(r)


def _safetensors_steps(directory: str, tokens: int, r: dict[str, Any], times: dict[str, Any]) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = os.path.join(directory, "kv.safetensors")
    first, second = _tensors(0, tokens), _tensors(1, tokens)
    r["bytes"] = sum(t.numel() * t.element_size() for t in first.values())
    with timed(times, "write_s"):
        step(r, "save_file", lambda: save_file(first, path, metadata={"engine": "kvfs-test"}))
    with timed(times, "read_s"):
        step(r, "load_file_equal", lambda: _equal(load_file(path), first))

    def mmap_slice() -> bool:
        with safe_open(path, framework="pt") as f:
            ok = f.metadata() == {"engine": "kvfs-test"}
            return ok and torch.equal(f.get_slice("f32")[10:20], first["f32"][10:20])

    step(r, "safe_open_slice_equal", mmap_slice)
    step(r, "save_file_replace", lambda: save_file(second, path))
    step(r, "load_file_replaced_equal", lambda: _equal(load_file(path), second))


def _transformers_steps(directory: str, r: dict[str, Any], times: dict[str, Any]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = os.path.join(directory, "tiny-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(cfg)
    with timed(times, "write_s"):
        step(r, "save_pretrained", lambda: model.save_pretrained(model_dir))

    def reload_equal() -> bool:
        back = LlamaForCausalLM.from_pretrained(model_dir)
        want, got = model.state_dict(), back.state_dict()
        return want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)

    with timed(times, "read_s"):
        step(r, "from_pretrained_equal", reload_equal)
    step(r, "save_pretrained_again", lambda: model.save_pretrained(model_dir))
    step(r, "listing", lambda: sorted(os.listdir(model_dir)))


if __name__ == "__main__":
    main()
