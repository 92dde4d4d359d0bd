#!/usr/bin/env bash
# sm90 lane (Hopper: H100, H200).  Uses the machine's python (CUDA torch + triton already there):
#   PY=python3 bash ci/sm90.sh [OUTDIR]
# Runs the gpu/sm90 pytest lane with -n auto, the sweep, the benchmarks and the cuBLAS audit,
# writing every log and report under OUTDIR (default: out/).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
status=0
$PY -m pytest --lane sm90 -n "${WORKERS:-auto}" -q -p no:cacheprovider --junitxml="$OUT/pytest-sm90.xml" \
    2>&1 | tee "$OUT/pytest-sm90.log" | tail -n 40 || status=1
$PY -m batchinv.harness.cli sweep --lane sm90 --no-progress --report "$OUT/sweep-sm90.jsonl" \
    2>&1 | tee "$OUT/sweep-sm90.txt" || status=1
$PY -m batchinv.harness.cli bench --lane sm90 --out "$OUT/bench-sm90" 2>&1 | tee "$OUT/bench-sm90.txt" || status=1
$PY -m batchinv.harness.cli audit cublas --lane sm90 --out "$OUT/audit-cublas-sm90" \
    2>&1 | tee "$OUT/audit-cublas-sm90.txt" || status=1
exit $status
