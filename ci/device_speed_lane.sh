#!/usr/bin/env bash
# One device call: the full lane (ci/device_full_lane.sh: sweep cold and warm, make test), then
# `batchinv bench matmul` (issue 11's table), logs under OUTDIR.     bash ci/device_speed_lane.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; mkdir -p "$OUT"
bash ci/device_full_lane.sh "$OUT"
t0=$(date +%s)
timeout --signal=INT 150 python3 -m batchinv.harness.cli bench matmul --reps 20 --out "$OUT/bench-matmul" >"$OUT/bench-matmul.log" 2>&1
echo "step bench-matmul: rc=$? in $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
grep -c "^bench matmul fast" "$OUT/bench-matmul.log"
