"""The ``vllm-connector-warm`` row of ``kvfs bench engines``: KvfsConnector's warm TTFT,
layer by layer and in whole steps, against vLLM's stock ``ExampleConnector`` on a plain
directory, with one warm engine process per connector.

The ``vllm-connector`` row starts six engine processes per round (a cold and a warm one
per connector and mode, and one without a connector); on a shared CPU machine that takes
longer than a session has. Here each connector gets one process (``vllm_client.py
warm``): a cold pass over the prompts (it computes, and the connector saves), then
``max(2, --rounds)`` warm rounds of the same prompts with vLLM's own prefix cache off, so
that every prompt's KV comes through the connector. The ExampleConnector's warm passes
read the files its cold pass just wrote (a warm page cache); KvfsConnector's rounds have
one pass loading layer by layer and one loading whole steps (the worker's connector
switched between passes, in turns first). A figure is the median, over a mode's warm
passes, of each pass's median TTFT. The engine process is warm in every warm pass (its
own start-up and first-request costs are in neither).

Aims: KvfsConnector warm TTFT (layer by layer) <= 0.8 x ExampleConnector's, and layer by
layer <= 0.85 x whole steps. The ``step load ms (floor)`` row says what layer by layer can
reach at best: the median time a whole-step load took inside the engine (the connector's
own timing, from the lease to the last byte) and the step's TTFT less all of it, over the
step's TTFT (perfect overlap hides the whole load, no more). ``connector ms/request``:
the time each connector's worker-side calls that the forward waits for took per request
(``start_load_kv``, ``wait_for_layer_load``, ``save_kv_layer``, ``wait_for_save``, timed
inside the engine), and the example's warm TTFT with its connector's share replaced by
KvfsConnector's (layer by layer), over the example's: what the connector can change. ``ok`` when every pass of both connectors produced the same
tokens, the warm passes cached the same number of tokens, and kvfs loaded blocks and
failed none.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bench_native_rows import failed
from .engine_clients import ClientFailed, run_client

__all__ = ["AIM_CONNECTOR", "AIM_LAYERWISE", "WHAT", "bench_connector_warm", "rows"]

AIM_CONNECTOR = 0.8  # KvfsConnector's warm TTFT (layer by layer) over ExampleConnector's
AIM_LAYERWISE = 0.85  # layer by layer over whole steps
WHAT = "vLLM KvfsConnector (layers, steps) vs ExampleConnector, one warm process each"


def _pass_ms(p: dict[str, Any]) -> float:
    return 1e3 * float(statistics.median(q["ttft_s"] for q in p["requests"]))


def _seen(p: dict[str, Any]) -> list[tuple[list[int], int]]:
    return [(q["tokens"], q["num_cached_tokens"]) for q in p["requests"]]


def bench_connector_warm(
    plain_root: Path, mountpoint: Path, args: argparse.Namespace, model: Path, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Both connectors, one engine process each; figures and ratios."""
    venvs = Path(args.venvs) if args.venvs else None
    rounds = max(2, args.rounds)
    prompts = "4" if args.quick else "8"
    out: dict[str, Any] = {"client": "vllm-connector-warm", "what": WHAT, "rounds": rounds, "prompts": int(prompts)}
    runs: dict[str, dict[str, Any]] = {}
    shutil.rmtree(mountpoint / "vllm", ignore_errors=True)  # the connector's namespace: cold
    for connector, kv in (("example", plain_root / "vllm-connector-warm"), ("kvfs", mountpoint)):
        progress(f"vllm-connector-warm: {connector} connector on {kv}, {rounds} warm rounds")
        cmd = ["warm", "--model", str(model), "--connector", connector, "--kv", str(kv)]
        cmd += ["--prompts", prompts, "--prompt-len", "992", "--rounds", str(rounds)]
        try:
            runs[connector] = run_client("vllm", *cmd, venvs=venvs, timeout=1800)
        except ClientFailed as exc:
            if connector == "example":
                raise
            out["status"] = failed(exc)
            return out
    ex, kv = runs["example"]["passes"], runs["kvfs"]["passes"]
    status = "ok"
    tokens = [[t for t, _ in _seen(p)] for p in ex + kv]
    if any(t != tokens[0] for t in tokens):
        status = "differs: tokens"
    elif any(_seen(p) != _seen(ex[1]) for p in ex[1:] + kv[1:]):
        status = "differs: cached tokens"
    elif any(p["kvfs"]["load_failed"] or not p["kvfs"]["loaded"] for p in kv[1:]):
        status = "differs: kvfs loads " + str([p["kvfs"] for p in kv[1:]])
    figs = {
        "example": [_pass_ms(p) for p in ex[1:]],
        "layer": [_pass_ms(p) for p in kv[1:] if p["load"] == "layer"],
        "step": [_pass_ms(p) for p in kv[1:] if p["load"] == "step"],
    }
    warm = {k: statistics.median(v) for k, v in figs.items()}
    # what a whole-step load took inside the engine (the connector's own timing, lease to
    # last byte): layer by layer can hide at most that much of a step's TTFT
    step_load = statistics.median(ms for p in kv[1:] if p["load"] == "step" for ms in p["load_ms"])
    # the connector's calls the forward waited for, per request (timed in the engine)
    conn = {
        "example": statistics.median(p["connector_ms"] for p in ex[1:]),
        "layer": statistics.median(p["connector_ms"] for p in kv[1:] if p["load"] == "layer"),
        "step": statistics.median(p["connector_ms"] for p in kv[1:] if p["load"] == "step"),
    }
    out.update(
        status=status,
        passes_ms=figs,
        warm_ms=warm,
        cold_ms={"example": _pass_ms(ex[0]), "kvfs": _pass_ms(kv[0])},
        cached_tokens=[c for _, c in _seen(ex[1])],
        kvfs_load_ms={m: [p["load_ms"] for p in kv[1:] if p["load"] == m] for m in ("layer", "step")},
        step_load_ms=step_load,
        layer_bound=(warm["step"] - step_load) / warm["step"],
        connector_ms=conn,
        # KvfsConnector's best against the example's TTFT: the example's TTFT with its
        # connector's time on the forward replaced by kvfs's (layer by layer)
        connector_bound=(warm["example"] - conn["example"] + conn["layer"]) / warm["example"],
        ratio={
            "layer_vs_example": warm["layer"] / warm["example"],
            "step_vs_example": warm["step"] / warm["example"],
            "layer_vs_step": warm["layer"] / warm["step"],
            "cold": _pass_ms(kv[0]) / _pass_ms(ex[0]),
        },
    )
    return out


def rows(c: dict[str, Any]) -> list[list[str]]:
    """The bench's table rows: client, figure, baseline, kvfs, ratio, aim, result."""
    name, status = c["client"], c.get("status", "")
    if "warm_ms" not in c:
        return [[name, "-", "-", "-", "-", "-", status]]
    w, r = c["warm_ms"], c["ratio"] if status == "ok" else dict.fromkeys(c["ratio"])
    cm = c["connector_ms"]

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    return [
        [name, "cold TTFT ms", f"{c['cold_ms']['example']:.1f}", f"{c['cold_ms']['kvfs']:.1f}", ratio(r["cold"]), "-"]
        + [status],
        [name, "warm TTFT ms, layers", f"{w['example']:.1f}", f"{w['layer']:.1f}", ratio(r["layer_vs_example"])]
        + [f"<= {AIM_CONNECTOR:.2f}", ""],
        [name, "warm TTFT ms, steps", f"{w['example']:.1f}", f"{w['step']:.1f}", ratio(r["step_vs_example"]), "-", ""],
        [name, "warm layers vs steps", f"{w['step']:.1f}", f"{w['layer']:.1f}", ratio(r["layer_vs_step"])]
        + [f"<= {AIM_LAYERWISE:.2f}", ""],
        # the floor of layers vs steps: a step's TTFT less all of its load, hidden
        [name, "step load ms (floor)", f"{w['step']:.1f}", f"{c['step_load_ms']:.1f}", f"{c['layer_bound']:.2f}x"]
        + ["-", ""],
        # the connectors' own time on the forward's path per request, and what it allows
        [name, "connector ms/request", f"{cm['example']:.1f}", f"{cm['layer']:.1f}", f"{c['connector_bound']:.2f}x"]
        + ["-", ""],
    ]
