#!/usr/bin/env bash
# A GPU lane (LANE=sm90 or sm100; ci/sm90.sh and ci/sm100.sh set it).  Uses the machine's python
# (CUDA torch + triton already there):
#   LANE=sm90 PY=python3 bash ci/gpu_lane.sh [OUTDIR]
# Runs the lane's pytest markers with -n auto, the sweep, the benchmarks, the cuBLAS audit and
# the topk tuning table, each under its own time cap, writing every log and report under OUTDIR
# (default: out/).  Exit status: non-zero if any step failed or ran out of time.
set -uo pipefail
cd "$(dirname "$0")/.."
LANE=${LANE:?set LANE=sm90 or LANE=sm100}
PY=${PY:-python3}
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-200}
status=0
step() {  # step NAME SECONDS CMD...: run with a time cap, log to $OUT/NAME.log, remember failure
    local name=$1 cap=$2; shift 2
    local t0=$SECONDS
    timeout --signal=INT --kill-after=20 "$cap" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "step $name: rc=$rc in $((SECONDS - t0))s (cap ${cap}s)" | tee -a "$OUT/steps.txt"
    [ $rc -eq 0 ] || status=1
}
. ci/device_env.sh; device_env "$OUT" "$PY"
step install 120 $PY -m pip install --no-deps --no-build-isolation -e .
step pytest "${PYTEST_CAP:-600}" $PY -m pytest --lane "$LANE" -n "${WORKERS:-auto}" --dist loadgroup -q -p no:cacheprovider -rfEsx \
    --junitxml="$OUT/pytest.xml"
step sweep "${SWEEP_CAP:-180}" $PY -m batchinv.harness.cli sweep --lane "$LANE" --no-progress --report "$OUT/sweep.jsonl"
step bench "${BENCH_CAP:-150}" $PY -m batchinv.harness.cli bench --lane "$LANE" --out "$OUT/bench"
step audit "${AUDIT_CAP:-120}" $PY -m batchinv.harness.cli audit cublas --lane "$LANE" --out-dir "$OUT"
step tune_topk "${TUNE_CAP:-60}" $PY ci/tune_topk.py
cat "$OUT/steps.txt"
exit $status
