"""``kvfs bench engines``: real engine clients on a kvfs mount next to a plain directory.

Mounts kvfs (a DRAM tier over a disk tier, in a temporary directory) and, in the same run,
makes a plain directory on the same filesystem as the disk tier; then runs each engine
client (``kvfs.tools.engine_clients``, each in its own virtualenv built by ``.ci/engines``)
on both, with the same workload, and prints per client:

- **writes**: bytes the client stored / seconds it took (GB/s), kvfs/plain (aim >= 0.80);
- **reads**: seconds a second process took to read them back, kvfs/plain (aim <= 1.15);
- **warm TTFT** (vLLM): median first-token latency of a second engine process that loads
  the KV through ExampleConnector, kvfs/plain (aim <= 1.15); cold TTFT (it saves) too;
- **the vLLM connector** (``vllm-connector``): kvfs's own ``KvfsConnector`` on the mount
  (the batch client, the DRAM arena) against the stock ``ExampleConnector`` on the plain
  directory, the same prompts: cold and warm TTFT, kvfs/example (aim <= 0.8; the
  example's warm process reads files the cold one just wrote: a warm page cache), warm
  TTFT loading layer by layer against whole steps (aim <= 0.85), and warm TTFT against
  the same engine with no connector (every token computed); ``ok`` when all produced the
  same tokens and cached the same number of tokens;
- **vllm-connector-warm**: the same aims with one warm engine process per connector (a
  cold pass, then warm passes; KvfsConnector's alternate layer by layer and whole steps):
  two engine starts instead of six per round (``tools/bench_vllm_connector.py``);
- **sglang-backend**: kvfs's own SGLang HiCache backend against SGLang's ``HiCacheFile`` on
  the plain directory, set and get GB/s, kvfs/plain (aim >= 1.5 on gets;
  ``tools/bench_sglang_backend.py``);
- **vllm-tier**: kvfs's secondary tier of vLLM's tiered offloading against vLLM's ``fs``
  tier on the plain directory, store and load GB/s under vLLM's own manager, kvfs/fs (aim
  >= 2; ``tools/bench_vllm_tier.py``);
- **lmcache-backend**: kvfs's LMCache remote storage plugin against LMCache's fs connector
  on the plain directory, put and get GB/s under LMCache's own StorageManager, kvfs/fs (aim
  >= 1.5; ``tools/bench_lmcache_backend.py``);
- whether the kvfs run did what the plain run did (same results, same files and bytes):
  ``ok``, ``differs: <where>``, or ``failed: <why>`` when the client crashed on kvfs.

``--json`` prints one object instead. A client whose virtualenv is missing is listed as
``missing`` with the command that builds it. The machine's load average is printed with
the figures: they are only comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import bench_lmcache_backend, bench_sglang_backend, bench_vllm_connector, bench_vllm_tier
from .engine_clients import CLIENTS, ClientFailed, ClientMissing, client_python, differences, run_client, without
from .flags import positive_int
from .render import table
from .scratch import dram_disk_config, mount, umount

MiB = 1 << 20

# bench name -> what it runs (its phases: _phases)
WORKLOADS = {
    "vllm": "vLLM ExampleConnector",
    "vllm-fs-tier": "vLLM fs tier (fs_io_C)",
    "sglang": "SGLang HiCacheFile",
    "lmcache": "LMCache fs connector",
    "lmcache-disk": "LMCache LocalDiskBackend",
    "safetensors": "safetensors save/load_file",
    "vllm-connector": "vLLM KvfsConnector vs ExampleConnector",
    "vllm-connector-warm": bench_vllm_connector.WHAT,
    "sglang-backend": bench_sglang_backend.WHAT,
    "vllm-tier": bench_vllm_tier.WHAT,
    "lmcache-backend": bench_lmcache_backend.WHAT,
}

# bench name -> the engine client whose virtualenv it needs
_VENV_OF = {"lmcache-disk": "lmcache", "vllm-connector": "vllm", "vllm-connector-warm": "vllm"}

AIM_WRITE, AIM_READ = 0.80, 1.15
AIM_CONNECTOR = 0.8  # KvfsConnector's warm TTFT over ExampleConnector's (warm page cache)
AIM_LAYERWISE = 0.85  # KvfsConnector's warm TTFT layer by layer over whole steps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clients", default=",".join(WORKLOADS), help=f"comma separated, of {', '.join(WORKLOADS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller workloads (CI, shared machines)")
    parser.add_argument("--rounds", type=positive_int, default=1, help="runs per directory, best kept (default 1)")
    parser.add_argument(
        "--transport",
        default="auto",
        choices=["auto", "kernel", "pyfuse3"],
        help="the mount's FUSE transport ([mount] transport; default auto)",
    )
    parser.add_argument(
        "--lean", action="store_true", help="a DRAM tier without prefault and mlock (faster to mount, slower seals)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", default=None, help="where the mount, its disk tier and the plain dir go")
    parser.add_argument("--venvs", default=None, help="the engine virtualenvs (default: .venvs of the source tree)")


def _phases(name: str, d: Path, quick: bool, model: Path | None) -> list[tuple[str, list[str]]]:
    """The client script and its arguments for each phase (process) of *name* on *d*."""
    if name == "vllm":
        n = "4" if quick else "8"
        gen = ["generate", "--model", str(model), "--kv", str(d), "--prompts", n, "--prompt-len", "992"]
        return [("vllm", gen), ("vllm", gen)]
    if name == "vllm-fs-tier":
        blocks = ["--blocks", "32" if quick else "128", "--block-kib", "1024", "--io", "fs_io_C"]
        return [("vllm-fs-tier", ["--root", str(d), "--phase", p, *blocks]) for p in ("store", "load")]
    if name == "sglang":
        pages = ["--pages", "16" if quick else "64", "--layers", "8", "--heads", "8", "--head-dim", "128"]
        return [("sglang", ["--dir", str(d), "--phase", p, *pages]) for p in ("store", "load")]
    if name in ("lmcache", "lmcache-disk"):
        setup = ["--setups", "plugin" if name == "lmcache" else "disk", "--chunks", "16" if quick else "64"]
        return [("lmcache", ["--dir", str(d), "--phase", p, *setup]) for p in ("store", "load")]
    if name == "safetensors":
        return [("safetensors", ["--dir", str(d), "--part", "safetensors", "--tokens", "32768" if quick else "131072"])]
    raise ValueError(name)


def _figures(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Bytes, write and read seconds (and TTFTs for vLLM) out of the phases' results."""
    if name == "vllm":
        cold, warm = results
        return {
            "ttft_cold_ms": 1e3 * statistics.median(r["ttft_s"] for r in cold["requests"]),
            "ttft_warm_ms": 1e3 * statistics.median(r["ttft_s"] for r in warm["requests"]),
        }
    if name == "vllm-fs-tier":
        store, load = results[0]["fs_io_C"], results[1]["fs_io_C"]
        return {"bytes": store["bytes"], "write_s": store["times"]["store_s"], "read_s": load["times"]["load_s"]}
    if name.startswith("lmcache"):
        store, load = (next(iter(r["setups"].values())) for r in results)
        return {"bytes": results[0]["bytes"], "write_s": store["times"]["write_s"], "read_s": load["times"]["read_s"]}
    if name == "sglang":
        return {
            "bytes": results[0]["bytes"],
            "write_s": results[0]["times"]["write_s"],
            "read_s": results[1]["times"]["read_s"],
        }
    return {
        "bytes": results[0]["bytes"],
        "write_s": results[0]["times"]["write_s"],
        "read_s": results[0]["times"]["read_s"],
    }


def _run_phases(name: str, d: Path, args: argparse.Namespace, model: Path | None) -> dict[int, dict[str, Any]]:
    """Each phase's result by its number (a dict, so that :func:`differences` names keys)."""
    venvs = Path(args.venvs) if args.venvs else None
    phases = _phases(name, d, args.quick, model)
    return {i: run_client(client, *a, venvs=venvs, timeout=900) for i, (client, a) in enumerate(phases)}


def _best(figs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(figs[0])
    for f in figs[1:]:
        for k, v in f.items():
            out[k] = max(out[k], v) if k == "bytes" else min(out[k], v)
    return out


def bench_client(
    name: str, plain_root: Path, kvfs_root: Path, args: argparse.Namespace, model: Path | None
) -> dict[str, Any]:
    """Run *name* on both directories (``--rounds`` times each, alternating); its figures,
    ratios and whether the kvfs run matched the plain one."""
    out: dict[str, Any] = {"client": name, "what": WORKLOADS[name]}
    figs: dict[str, list[dict[str, Any]]] = {"plain": [], "kvfs": []}
    for r in range(args.rounds):
        results = {}
        for kind, root in (("plain", plain_root), ("kvfs", kvfs_root)):
            d = root / f"{name}-{r}"
            _progress(f"{name} on {kind} ({d})")
            try:
                results[kind] = _run_phases(name, d, args, model)
            except ClientFailed as exc:
                if kind == "plain":
                    raise
                out["status"] = "failed: " + _first_error(exc.output)
                return out
            figs[kind].append(_figures(name, list(results[kind].values())))
        diff = differences(without(results["kvfs"]), without(results["plain"]))
        out["status"] = "ok" if not diff else "differs: " + ", ".join("/".join(map(str, p[1:4])) for p in diff[:3])
        if diff:
            break
    plain, kvfs = _best(figs["plain"]), _best(figs["kvfs"])
    out["plain"], out["kvfs"] = plain, kvfs
    ratio: dict[str, Any] = {}
    if "write_s" in plain:
        ratio["write"] = plain["write_s"] / kvfs["write_s"]  # throughput, kvfs over plain
        ratio["read_time"] = kvfs["read_s"] / plain["read_s"]
    for k in ("ttft_cold_ms", "ttft_warm_ms"):
        if k in plain:
            ratio[k.replace("_ms", "")] = kvfs[k] / plain[k]
    out["ratio"] = ratio
    return out


def _vllm_args(model: Path, quick: bool, connector: str, kv: Path | None, load: str = "layer") -> list[str]:
    n = "4" if quick else "8"
    out = ["generate", "--model", str(model), "--connector", connector, "--prompts", n, "--prompt-len", "992"]
    if connector == "kvfs":
        out += ["--kvfs-load", load]
    return out + (["--kv", str(kv)] if kv is not None else [])


def _ttft_ms(res: dict[str, Any]) -> float:
    ms: float = 1e3 * statistics.median(r["ttft_s"] for r in res["requests"])
    return ms


def bench_connector(plain_root: Path, mp: Path, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """``vllm-connector``: per round, the ExampleConnector on the plain directory (a cold
    process, a warm one), KvfsConnector on the mount (its blocks removed first: a cold
    process, then a warm one loading layer by layer and one loading whole steps, in turns
    first), and one process with no connector; best of the rounds."""
    out: dict[str, Any] = {"client": "vllm-connector", "what": WORKLOADS["vllm-connector"]}
    venvs = Path(args.venvs) if args.venvs else None
    figs: dict[str, list[dict[str, Any]]] = {"plain": [], "kvfs": [], "step": [], "none": []}
    status = "ok"
    for r in range(args.rounds):
        shutil.rmtree(mp / "vllm", ignore_errors=True)  # the connector's namespace: cold again
        warm = [("layer", "kvfs"), ("step", "step")]
        if r % 2:
            warm.reverse()
        plan = [
            ("plain", "example", plain_root / f"vllm-connector-{r}", "layer"),
            ("plain", "example", plain_root / f"vllm-connector-{r}", "layer"),
            ("kvfs", "kvfs", mp, "layer"),  # cold: computes and saves
            *((kind, "kvfs", mp, load) for load, kind in warm),
            ("none", "none", None, "layer"),
        ]
        runs: dict[str, list[dict[str, Any]]] = {}
        try:
            for kind, connector, kv, load in plan:
                _progress(f"vllm-connector: {connector} connector{f' on {kv}' if kv else ''} ({load})")
                runs.setdefault(kind, []).append(
                    run_client("vllm", *_vllm_args(model, args.quick, connector, kv, load), venvs=venvs, timeout=900)
                )
        except ClientFailed as exc:
            if kind in ("plain", "none"):
                raise
            out["status"] = "failed: " + _first_error(exc.output)
            return out
        for kind in ("plain", "kvfs"):
            cold, warm_run = runs[kind]
            figs[kind].append({"ttft_cold_ms": _ttft_ms(cold), "ttft_warm_ms": _ttft_ms(warm_run)})
        figs["step"].append({"ttft_warm_ms": _ttft_ms(runs["step"][0])})
        figs["none"].append({"ttft_cold_ms": _ttft_ms(runs["none"][0])})
        seen = {
            k: [[(q["tokens"], q["num_cached_tokens"]) for q in res["requests"]] for res in v] for k, v in runs.items()
        }
        if seen["kvfs"] != seen["plain"] or seen["step"][0] != seen["kvfs"][1]:
            status = "differs: tokens or cached tokens"
            break
        if [t for t, _ in seen["kvfs"][1]] != [t for t, _ in seen["none"][0]]:
            status = "differs: tokens"
            break
        for res in (runs["kvfs"][1], runs["step"][0]):
            if res["kvfs"]["load_failed"] or not res["kvfs"]["loaded"]:
                status = f"differs: kvfs loads {res['kvfs']}"
                break
    plain, kvfs, step, none = (_best(figs[k]) for k in ("plain", "kvfs", "step", "none"))
    out.update(status=status, plain=plain, kvfs=kvfs, step=step, none=none)
    out["ratio"] = {
        "ttft_cold": kvfs["ttft_cold_ms"] / plain["ttft_cold_ms"],
        "ttft_warm": kvfs["ttft_warm_ms"] / plain["ttft_warm_ms"],
        "ttft_warm_step": step["ttft_warm_ms"] / plain["ttft_warm_ms"],
        "layer_vs_step": kvfs["ttft_warm_ms"] / step["ttft_warm_ms"],
        "ttft_warm_vs_none": kvfs["ttft_warm_ms"] / none["ttft_cold_ms"],
        "example_warm_vs_none": plain["ttft_warm_ms"] / none["ttft_cold_ms"],
    }
    return out


def _first_error(output: str) -> str:
    """The last line of *output* that names an error, without vLLM's ``[rank0]:`` prefix."""
    lines = [ln for ln in output.splitlines() if "Error" in ln or "error" in ln] or output.strip().splitlines()
    return lines[-1].removeprefix("[rank0]: ").strip()[-160:] if lines else "no output"


def _progress(msg: str) -> None:
    print(f"bench engines: {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from kvfs.mount.daemon import mount_type  # noqa: F401  (fails early without the mount extra)

    names = [n.strip() for n in args.clients.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"kvfs: bench engines: unknown client {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    venvs = Path(args.venvs) if args.venvs else None
    base = Path(tempfile.mkdtemp(prefix="kvfs-bench-engines-", dir=args.dir))
    result: dict[str, Any] = {
        "load_avg_before": os.getloadavg(),
        "quick": args.quick,
        "rounds": args.rounds,
        "transport": args.transport,
        "lean": args.lean,
        "clients": [],
    }
    rows = []
    try:
        available = []
        for name in names:
            client = CLIENTS[_VENV_OF.get(name, name)]
            try:
                client_python(client, venvs)
                available.append(name)
            except ClientMissing as exc:
                result["clients"].append({"client": name, "what": WORKLOADS[name], "status": f"missing: {exc}"})
        model = None
        if {"vllm", "vllm-connector", "vllm-connector-warm"} & set(available):
            model = base / "tiny-llama"
            _progress("writing the model config (8 layers, 4 KV heads of 64)")
            run_client(
                "vllm", "model", "--out", str(model), "--layers", "8", "--heads", "8", "--kv-heads", "4", venvs=venvs
            )
        plain_root = base / "plain"
        plain_root.mkdir()
        mp = base / "mnt"
        dram = (512 if args.quick else 1024) * MiB
        # the DRAM tier as deployed (prefaulted and locked: its defaults) unless --lean
        extra = f'[mount]\ntransport = "{args.transport}"\n'
        mount(mp, dram_disk_config(base, dram, 4 * dram, lean=args.lean, extra=extra))
        try:
            for name in available:
                if name == "vllm-connector":
                    assert model is not None
                    result["clients"].append(bench_connector(plain_root, mp, args, model))
                elif name == "vllm-connector-warm":
                    assert model is not None
                    result["clients"].append(
                        bench_vllm_connector.bench_connector_warm(plain_root, mp, args, model, _progress)
                    )
                elif name == "sglang-backend":  # a backend of its own against SGLang's: its own rows
                    result["clients"].append(bench_sglang_backend.bench_sglang_backend(plain_root, mp, args, _progress))
                elif name == "vllm-tier":
                    result["clients"].append(bench_vllm_tier.bench_vllm_tier(plain_root, mp, args, _progress))
                elif name == "lmcache-backend":
                    result["clients"].append(
                        bench_lmcache_backend.bench_lmcache_backend(plain_root, mp, args, _progress)
                    )
                else:
                    result["clients"].append(bench_client(name, plain_root, mp, args, model))
        finally:
            umount(mp)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["load_avg_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for c in result["clients"]:
        rows.extend(_rows(c))
    print(table(["CLIENT", "FIGURE", "PLAIN", "KVFS", "KVFS/PLAIN", "AIM", "RESULT"], rows))
    la, lb = result["load_avg_before"], result["load_avg_after"]
    dram_tier = "lean DRAM tier (no prefault, no mlock)" if args.lean else "DRAM tier prefaulted"
    print(
        f"load average {la[0]:.2f} before, {lb[0]:.2f} after ({os.cpu_count()} CPUs); "
        f"kvfs transport {args.transport}, {dram_tier}"
    )
    return 0


def _rows(c: dict[str, Any]) -> list[list[str]]:
    if c["client"] == "sglang-backend":
        return bench_sglang_backend.rows(c)
    if c["client"] == "vllm-tier":
        return bench_vllm_tier.rows(c)
    if c["client"] == "lmcache-backend":
        return bench_lmcache_backend.rows(c)
    if c["client"] == "vllm-connector-warm":
        return bench_vllm_connector.rows(c)
    status = c.get("status", "")
    if "plain" not in c:
        return [[c["client"], "-", "-", "-", "-", "-", status]]
    p, k = c["plain"], c["kvfs"]
    # a ratio of a run that did not do what the plain run did measures nothing
    r = c["ratio"] if status == "ok" else dict.fromkeys(c["ratio"])
    rows = []
    if "write_s" in p:
        rows.append(
            [
                c["client"],
                "write GB/s",
                f"{_gbps(p):.3f}",
                f"{_gbps(k):.3f}",
                _ratio(r["write"]),
                f">= {AIM_WRITE}",
                status,
            ]
        )
        rows.append(
            [
                c["client"],
                "read s",
                f"{p['read_s']:.4f}",
                f"{k['read_s']:.4f}",
                _ratio(r["read_time"]),
                f"<= {AIM_READ}",
                "",
            ]
        )
    for key, label in (("ttft_cold_ms", "cold TTFT ms"), ("ttft_warm_ms", "warm TTFT ms")):
        if key in p:
            aim = "-" if "warm" not in key else f"<= {AIM_CONNECTOR if 'none' in c else AIM_READ:.2f}"
            if "step" in c and key == "ttft_warm_ms":
                label = "warm TTFT ms, layers"
            rows.append(
                [
                    c["client"],
                    label,
                    f"{p[key]:.1f}",
                    f"{k[key]:.1f}",
                    _ratio(r[key[:-3]]),
                    aim,
                    status if not rows else "",
                ]
            )
    if "step" in c:  # whole steps, against the example and against layer by layer
        st = c["step"]["ttft_warm_ms"]
        rows.append(
            [
                c["client"],
                "warm TTFT ms, steps",
                f"{p['ttft_warm_ms']:.1f}",
                f"{st:.1f}",
                _ratio(r["ttft_warm_step"]),
                "-",
                "",
            ]
        )
        rows.append(
            [
                c["client"],
                "warm layers vs steps",
                f"{st:.1f}",
                f"{k['ttft_warm_ms']:.1f}",
                _ratio(r["layer_vs_step"]),
                f"<= {AIM_LAYERWISE:.2f}",
                "",
            ]
        )
    if "none" in c:  # the connector against the same engine computing every token
        n = c["none"]["ttft_cold_ms"]
        rows.append(
            [
                c["client"],
                "warm TTFT vs none",
                f"{n:.1f}",
                f"{k['ttft_warm_ms']:.1f}",
                _ratio(r["ttft_warm_vs_none"]),
                "-",
                "",
            ]
        )
        rows.append(
            [
                c["client"],
                "example warm vs none",
                f"{n:.1f}",
                f"{p['ttft_warm_ms']:.1f}",
                _ratio(r["example_warm_vs_none"]),
                "-",
                "",
            ]
        )
    return rows


def _gbps(fig: dict[str, Any]) -> float:
    gbps: float = fig["bytes"] / fig["write_s"] / 1e9
    return gbps


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
