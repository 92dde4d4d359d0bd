#!/usr/bin/env bash
# A GPU lane (LANE=sm90 or sm100; ci/sm90.sh and ci/sm100.sh set it).  Uses the machine's python
# (CUDA torch + triton already there):
#   LANE=sm90 PY=python3 bash ci/gpu_lane.sh [OUTDIR]
# Runs, through ci/device.sh, the lane's pytest markers with -n auto, the sweep, the benchmarks,
# the cuBLAS audit and the topk tuning table, each under its own time cap (PYTEST_CAP 600,
# SWEEP_CAP 180, BENCH_CAP 150, AUDIT_CAP 120, TUNE_CAP 60 seconds), writing every log and
# report under OUTDIR (default: out/).  Exit status: non-zero if any step failed or ran out of
# time.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export LANE=${LANE:?set LANE=sm90 or LANE=sm100}
OUT=${1:-out}
WORKERS=${WORKERS:-auto} REPS=${REPS:-50} TAIL=${TAIL:-0} exec bash ci/device.sh "$OUT" \
    "pytest:--junitxml=$OUT/pytest.xml@${PYTEST_CAP:-600}" \
    "sweep@${SWEEP_CAP:-180}" \
    "bench@${BENCH_CAP:-150}" \
    "audit:cublas@${AUDIT_CAP:-120}" \
    "tune:topk@${TUNE_CAP:-60}"
