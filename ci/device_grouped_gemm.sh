#!/usr/bin/env bash
# One device call: grouped_gemm on a GPU lane -- its pytest file, the generic component tests and
# its sweep -- logs under OUTDIR.   PY=python3 LANE=sm90 bash ci/device_grouped_gemm.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; LANE=${LANE:-sm90}; OUT=${1:-out}
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" "$PY"
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
t0=$SECONDS
timeout ${PYTEST_S:-240} $PY -m pytest tests/test_grouped_gemm.py tests/test_components.py -k grouped_gemm --lane "$LANE" -n 4 -q -p no:cacheprovider -rfEsx >"$OUT/pytest.log" 2>&1
echo "pytest rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"; t0=$SECONDS
timeout ${SWEEP_S:-240} $PY -m batchinv.harness.cli sweep grouped_gemm --lane "$LANE" --no-progress --report "$OUT/sweep.jsonl" >"$OUT/sweep.log" 2>&1
echo "sweep rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"
tail -25 "$OUT/pytest.log"; tail -30 "$OUT/sweep.log"
