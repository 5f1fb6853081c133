#!/usr/bin/env bash
# The whole GPU check in one call, on a machine with an NVIDIA GPU (the device tool's
# H200): environment, the GPU tests (every test_gpu_* case, CUDA ones included; the
# daemon's only where FUSE works there), `kvfs bench gpu --device cuda`, and vLLM's
# OffloadingConnector with the kvfs tier end to end where vLLM for CUDA is installed.
# Everything lands in $OUT (the device tool's folder; ./gpu-check elsewhere):
#   env.txt (nvidia-smi, versions), tests.txt, bench.json, bench.txt, offload*.txt, summary.txt.
#
# From a session with a device:  bash tools/gpu_wheels.sh   (here, once: wheels into .whl/)
#   run(command="bash tools/gpu_check.sh", carry=[".whl"], timeout_s=540)
# Budget: about 6-8 minutes on an H200 (tests ~3, bench ~3), under one call's 10.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
say() { echo "== $*" | tee -a "$OUT/summary.txt"; }

{ nvidia-smi; uname -a; "$PY" -V; } >"$OUT/env.txt" 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >>"$OUT/env.txt" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# kvfs itself (kvfs.gpu lives in gpu/: the package needs installing), offline
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$OUT/env.txt" 2>&1 \
    || say "kvfs did not install (see env.txt)"
"$PY" - >>"$OUT/env.txt" 2>&1 <<'PYEOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
for m in ("kvikio", "nixl_cu13", "nixl_cu12", "pyfuse3", "trio", "transformers", "xxhash"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "ok"))
    except Exception as exc:
        print(m, "MISSING:", exc)
try:
    import kvikio.defaults as d
    print("kvikio compat mode:", getattr(d, "is_compat_mode_preferred", getattr(d, "compat_mode", lambda: "?"))())
except Exception as exc:
    print("kvikio defaults:", exc)
from kvfs.gpu.transfer import open_loader
loader, passed = open_loader("auto", torch.device("cuda"))
print("auto transfer on cuda:", loader.name, "passed over:", passed)
PYEOF
say "environment: $(grep -E '^(torch|device|auto transfer)' "$OUT/env.txt" | tr '\n' ';')"
[ -e /dev/fuse ] || say "no /dev/fuse: the tests and bench rows that need a kvfs daemon skip or fail"

timeout 300 "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_transfer.py tests/gpu/test_gpu_agent.py \
    tests/gpu/test_gpu_prefix_cache.py tests/tools/test_bench_gpu.py >"$OUT/tests.txt" 2>&1
say "tests: exit $? — $(tail -1 "$OUT/tests.txt")"

timeout 240 "$PY" -m kvfs.tools.cli bench gpu --device cuda --blocks 128 --passes 5 --json \
    >"$OUT/bench.json" 2>"$OUT/bench.txt"
rc=$?
say "bench: exit $rc"
if [ $rc -eq 0 ]; then
    "$PY" - "$OUT/bench.json" <<'PYEOF' | tee -a "$OUT/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    if "skipped" in r:
        print(f"{r['path']:4} {r['op']:45} {r['skipped']}")
        continue
    fig = f"{r['gb_s']:.2f} GB/s" if "gb_s" in r else f"{r['ms']:.3f} ms"
    print(f"{r['path']:4} {r['op']:45} {fig:>14}  vs {r['baseline']}: x{r['ratio']:.2f}")
PYEOF
else
    tail -5 "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
fi

# vLLM's OffloadingConnector (tiered offloading) with kvfs's secondary tier, end to end on
# CUDA: a first engine process offloads through its CPU tier to the kvfs tier, a second one
# (an empty CPU tier) loads the prompts' KV back from it. Needs vLLM for CUDA in this
# environment and a kvfs mount (FUSE); it says which is missing and skips otherwise.
offload_e2e() {
    local why=""
    "$PY" -c "import vllm" >/dev/null 2>&1 || why="vLLM is not installed here (a CUDA vLLM wheel is ~400 MB, more than a device call carries; install it in the image to run this)"
    [ -z "$why" ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" && why="no CUDA device"
    [ -z "$why" ] && [ ! -e /dev/fuse ] && why="no /dev/fuse: no kvfs mount for the tier"
    if [ -n "$why" ]; then
        say "vLLM OffloadingConnector + KvfsTier end to end: skipped: $why"
        return
    fi
    local base mp
    base=$(mktemp -d /tmp/kvfs-offload-XXXXXX)
    mp=$base/mnt
    mkdir -p "$mp"
    printf '[[tiers]]\nkind = "dram"\ncapacity = "1GiB"\n\n[[tiers]]\nkind = "disk"\ncapacity = "4GiB"\npath = "%s/disk"\n' \
        "$base" >"$base/kvfs.toml"
    if ! "$PY" -m kvfs.tools.cli mount "$mp" --config "$base/kvfs.toml" >>"$OUT/offload.txt" 2>&1; then
        say "vLLM OffloadingConnector + KvfsTier end to end: kvfs did not mount (see offload.txt)"
        return
    fi
    local c=tools/engine_clients
    "$PY" $c/vllm_client.py model --out "$base/model" --layers 4 --heads 8 --kv-heads 4 >>"$OUT/offload.txt" 2>&1
    timeout 200 "$PY" $c/vllm_offload_client.py --model "$base/model" --kv "$mp" >"$OUT/offload-first.txt" 2>&1
    local rc1=$?
    timeout 200 "$PY" $c/vllm_offload_client.py --model "$base/model" --kv "$mp" >"$OUT/offload-second.txt" 2>&1
    local rc2=$?
    "$PY" -m kvfs.tools.cli umount "$mp" >>"$OUT/offload.txt" 2>&1
    "$PY" - "$OUT/offload-first.txt" "$OUT/offload-second.txt" "$rc1" "$rc2" <<'PYEOF' | tee -a "$OUT/summary.txt"
import json, sys
def result(path):
    lines = [l for l in open(path, errors="replace") if l.startswith("KVFS-RESULT ")]
    return json.loads(lines[-1][len("KVFS-RESULT "):]) if lines else None
first, second = result(sys.argv[1]), result(sys.argv[2])
if first is None or second is None:
    print(f"== offload e2e: FAILED (exit {sys.argv[3]}/{sys.argv[4]}; see offload-first.txt, offload-second.txt)")
    sys.exit(0)
same = [r["tokens"] for r in first["requests"]] == [r["tokens"] for r in second["requests"]]
cached = [r["num_cached_tokens"] for r in second["requests"]]
ok = same and all(c > 0 for c in cached) and first["tier_blocks"] > 0
print(f"== offload e2e: {'ok' if ok else 'FAILED'}: tier blocks {first['tier_blocks']}, second process cached "
      f"tokens {cached}, same tokens {same}, TTFT first/second "
      f"{[round(r['ttft_s'] * 1e3, 1) for r in first['requests']]} / {[round(r['ttft_s'] * 1e3, 1) for r in second['requests']]} ms")
PYEOF
}
offload_e2e
