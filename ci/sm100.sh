#!/usr/bin/env bash
# sm100 lane (Blackwell: B200, GB200).  Uses the machine's python (CUDA torch + triton already there):
#   PY=python3 bash ci/sm100.sh [OUTDIR]
# Runs the gpu/sm100 pytest lane with -n auto, the sweep, the benchmarks and the cuBLAS audit,
# writing every log and report under OUTDIR (default: out/).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
status=0
$PY -m pytest --lane sm100 -n "${WORKERS:-auto}" -q -p no:cacheprovider --junitxml="$OUT/pytest-sm100.xml" \
    2>&1 | tee "$OUT/pytest-sm100.log" | tail -n 40 || status=1
$PY -m batchinv.harness.cli sweep --lane sm100 --no-progress --report "$OUT/sweep-sm100.jsonl" \
    2>&1 | tee "$OUT/sweep-sm100.txt" || status=1
$PY -m batchinv.harness.cli bench --lane sm100 --out "$OUT/bench-sm100" 2>&1 | tee "$OUT/bench-sm100.txt" || status=1
$PY -m batchinv.harness.cli audit cublas --lane sm100 --out "$OUT/audit-cublas-sm100" \
    2>&1 | tee "$OUT/audit-cublas-sm100.txt" || status=1
exit $status
