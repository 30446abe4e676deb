#!/usr/bin/env bash
# One prepared check of a GPU machine, under 7 minutes:
#   1. on every GPU, one at a time: GEMM 8192x8192 in bf16, fp16, fp32,
#      int8 and fp8 (where the GPU has the kernel) and HBM copy/triad (<= 300 s)
#   2. all-reduce, all-gather and all-to-all bus bandwidth (64 MiB, 1 GiB) over every GPU of
#      the machine (torchrun, NCCL on CUDA / RCCL on ROCm), held against
#      what the GPUs' XGMI / NVLink / PCIe links allow (the
#      intranode_link_rate line; services/bench/link_rates.py)  (<= 120 s)
#   3. each figure, per GPU and the weakest GPU's as the node's, as a share
#      of the device's published peak
#      (peaks and their vendor sources: services/bench/gpu_peaks.py)
# Ends with one JSON line of the figures (baseline = peak, ratio = share).
#
#   bench/gpu_check.sh            # PYTHON=... to choose the interpreter
#   OUT=/tmp/gpu-check bench/gpu_check.sh   # keep the per-step JSON files
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
echo "== GEMM bf16/fp16/fp32/int8/fp8 8192 and HBM on each of $NGPU GPU(s)"
if ! timeout --signal=TERM --kill-after=10 300 "$PY" -m services.bench.gpu_check gemm --out "$OUT/gemm.json"; then
    echo "gpu_check: GEMM step failed or timed out" >&2
    status=1
fi

if [ "$NGPU" -ge 2 ]; then
    echo "== all-reduce / all-gather / all-to-all over $NGPU GPUs"
    if ! timeout --signal=TERM --kill-after=10 120 "$PY" -m torch.distributed.run --standalone \
            --nproc-per-node "$NGPU" -m services.bench.gpu_check collectives --out "$OUT/collectives.json"; then
        echo "gpu_check: collectives step failed or timed out" >&2
        status=1
    fi
else
    echo "== one GPU: no intra-node collectives to measure"
fi

echo "== share of published peak"
"$PY" -m services.bench.gpu_check report "$OUT" || status=1
exit $status
