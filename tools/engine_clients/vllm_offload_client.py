"""vLLM's ``OffloadingConnector`` with tiered offloading and kvfs's tier, end to end on a GPU.

Run by path in an environment with vLLM for CUDA and kvfs installed (``tools/gpu_check.sh``
does, on a machine with an NVIDIA GPU; vLLM refuses CPU offloading on a CPU machine, where
``vllm_tier_client.py`` drives the same tier through vLLM's manager instead). One engine
process: ``LLM(...)`` on a tiny random-weight Llama (``vllm_client.py model``) with::

    KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
        kv_connector_extra_config={"spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": ..., "secondary_tiers": [{"type": "KvfsTier",
            "module_path": "kvfs.gpu.vllm_tier", "kvfs_path": KV}]})

and the token-id prompts one request at a time (greedy). A first process computes and
offloads (GPU -> its CPU tier -> the kvfs tier); a second (an empty CPU tier) finds the
prompts' chunks in the kvfs tier, promotes them and loads them to the GPU: its
``num_cached_tokens`` count them and its tokens equal the first's. The result: per prompt
the tokens, ``num_cached_tokens`` and first-token latency; the blocks under the tier's
namespace on the mount.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from vllm_client import prompts

from client_report import emit


def generate(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    tier = {"type": "KvfsTier", "module_path": "kvfs.gpu.vllm_tier", "kvfs_path": args.kv}
    config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": args.cpu_mib << 20,
            "secondary_tiers": [tier],
        },
    )
    t0 = time.perf_counter()
    llm = LLM(
        model=args.model,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=args.prompt_len + args.max_tokens + 64,
        enforce_eager=True,
        seed=0,
        gpu_memory_utilization=args.gpu_util,
        enable_prefix_caching=False,  # every request goes to the offloading connector
        prefix_caching_hash_algo="sha256_cbor",
        disable_log_stats=False,
        kv_transfer_config=config,
    )
    startup = time.perf_counter() - t0
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, detokenize=False)
    requests = []
    for ids in prompts(args.prompts, args.prompt_len):
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        requests.append(
            {
                "tokens": list(out.outputs[0].token_ids),
                "num_cached_tokens": out.num_cached_tokens,
                "ttft_s": out.metrics.first_token_latency if out.metrics is not None else None,
            }
        )
    blocks = 0
    root = os.path.join(args.kv, "vllm-tier")
    for _dirpath, _dirs, files in os.walk(root):
        blocks += sum(1 for f in files if not f.endswith(".json"))
    return {"startup_s": startup, "requests": requests, "tier_blocks": blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--kv", required=True, help="the kvfs mount")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--cpu-mib", type=int, default=512, help="the CPU (primary) tier")
    parser.add_argument("--gpu-util", type=float, default=0.3)
    args = parser.parse_args()
    emit(generate(args))


if __name__ == "__main__":
    main()
