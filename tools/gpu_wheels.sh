#!/usr/bin/env bash
# Run HERE (a machine with PyPI) before tools/gpu_check.sh goes to a GPU machine that
# cannot reach the network: downloads into .whl/ (ignored by git, carried by the device
# tool) the wheels that the H200 image (Python 3.12, torch cu13) lacks for the GPU check:
# trio and pyfuse3 (the daemon), kvikio for CUDA 13 (GDS reads). NIXL's CUDA wheels are
# over 100 MiB, more than a device call may carry (64 MiB): its GPU rows skip there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PY=${PY:-.venv/bin/python}
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64)
get() {
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plat[@]}" -d .whl "$@"
}
get trio==0.35.0 outcome sniffio pyfuse3==3.5.0
get kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 || echo "kvikio wheels not found: the kvikio rows will skip"
du -sh .whl
total=$(du -sm .whl | cut -f1)
if [ "$total" -gt 60 ]; then
    echo "warning: .whl is ${total} MiB; a device call carries 64 MiB in all (the tree included)" >&2
fi
