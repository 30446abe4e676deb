#!/usr/bin/env bash
# One prepared check of a GPU machine (minutes on an 8-GPU node):
#   1. the bench agent's standard level, as it runs at onboarding: on every
#      GPU one at a time, GEMM in bf16, fp16, fp32, int8 and fp8 (where the
#      GPU has the kernel) at 4096 and 8192, and HBM copy/triad; the trial
#      training step on all GPUs at once; all-reduce, all-gather and
#      all-to-all bus bandwidth up to 1 GiB over every GPU, held against what
#      the GPUs' XGMI / NVLink / PCIe links allow; the driver versions
#   2. every node-health catalogue probe once (RDMA, PCIe, kernel log, GPU
#      RAS, mounts, NVMe, host settings, versions): "not applicable" where
#      the machine has nothing to check
#   3. a per-GPU table, each node figure (its weakest GPU's) as a share of
#      the device's published peak (services/bench/gpu_peaks.py) and against
#      the default floors, and every check
# Ends with one JSON line of the figures (baseline = peak, ratio = share).
#
#   bench/gpu_check.sh                        # PYTHON=... to choose the interpreter
#   OUT=/tmp/gpu-check bench/gpu_check.sh     # keep the step files
#   LEVEL_ARGS="--sizes 8192 --dtypes bf16" bench/gpu_check.sh
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3 || true)
if [ -z "$PY" ]; then echo "gpu_check: no python found (set PYTHON)" >&2; exit 2; fi
OUT=${OUT:-$(mktemp -d -t gpu-check-XXXXXX)}
mkdir -p "$OUT" && rm -f "$OUT"/*.json
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

NGPU=$(timeout 60 "$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null | tail -1)
if ! [[ "$NGPU" =~ ^[0-9]+$ ]] || [ "$NGPU" -eq 0 ]; then
    echo "gpu_check: torch sees no GPU (no ROCm/CUDA build of torch, or no device); nothing to check" >&2
    exit 2
fi
echo "gpu_check: $NGPU GPU(s); results in $OUT"

status=0
echo "== standard level on $NGPU GPU(s)"
# shellcheck disable=SC2086  # LEVEL_ARGS is a list of options
if ! timeout --signal=TERM --kill-after=10 $((240 + 60 * NGPU)) \
        "$PY" -m services.bench.gpu_check level --out "$OUT/level.json" ${LEVEL_ARGS:-}; then
    echo "gpu_check: the standard level failed, did not judge the node healthy, or timed out" >&2
    status=1
fi

echo "== node-health catalogue"
if ! timeout --signal=TERM --kill-after=10 300 "$PY" -m services.bench.gpu_check health \
        --out "$OUT/health.json"; then
    echo "gpu_check: a health probe failed, or the catalogue timed out" >&2
    status=1
fi

echo "== per GPU, share of published peak, floors and checks"
"$PY" -m services.bench.gpu_check report "$OUT" || status=1
exit $status
