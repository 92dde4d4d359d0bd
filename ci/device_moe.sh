#!/usr/bin/env bash
# Device calls for the MoE components on a GPU lane, logs under OUTDIR; STEPS any of
#   tune   ci/tune_fused_moe.py (every align block of the layer timed, bits compared)
#   bench  batchinv bench fused_moe (pinned layer vs token_count_configs)
#   pytest the MoE test files and the registry tests of the MoE components
#   sweep  batchinv sweep of the six MoE components
# PY=python3 LANE=sm90 bash ci/device_moe.sh OUTDIR "tune bench"
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; LANE=${LANE:-sm90}; OUT=${1:-out}; STEPS=${2:-"pytest sweep"}
MOE="moe_router moe_align grouped_gemm swiglu moe_combine fused_moe"
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" "$PY"
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
step() {  # step NAME CAP CMD...
    local name=$1 cap=$2; shift 2; local t0=$SECONDS
    timeout --signal=INT --kill-after=15 "$cap" "$@" >"$OUT/$name.log" 2>&1
    echo "step $name: rc=$? in $((SECONDS - t0))s (cap ${cap}s)" | tee -a "$OUT/steps.txt"
}
for s in $STEPS; do case $s in
  tune) step tune "${TUNE_S:-170}" $PY ci/tune_fused_moe.py ${TUNE_ARGS:-} ;;
  bench) step bench "${BENCH_S:-200}" $PY -m batchinv.harness.cli bench fused_moe --lane "$LANE" --reps 10 --out "$OUT/bench" ;;
  pytest) step pytest "${PYTEST_S:-260}" $PY -m pytest tests/test_grouped_gemm.py tests/test_fused_moe.py tests/test_swiglu.py tests/test_moe_router.py \
      tests/test_components.py -k "moe or grouped_gemm or swiglu" --lane "$LANE" -n "${WORKERS:-12}" -q -p no:cacheprovider -rfEx ;;
  sweep) step sweep "${SWEEP_S:-200}" $PY -m batchinv.harness.cli sweep $MOE --lane "$LANE" --no-progress --report "$OUT/sweep.jsonl" ;;
esac; done
for s in $STEPS; do echo "== $s"; tail -${TAIL:-40} "$OUT/$s.log"; done
