#!/usr/bin/env bash
# One device call after the Triton 3.6-3.9 compatibility work (issue 15): the kernels whose
# spelling changed (softmax, log_softmax, mean share fast/kernels/softmax.py's _grid_sum) and the
# version check, on the GPU image's own torch + Triton -- logs under OUTDIR.
#   PY=python3 LANE=sm90 bash ci/device_compat.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; LANE=${LANE:-sm90}; OUT=${1:-out}
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" "$PY"
"$PY" -c "import numpy, packaging; print('numpy', numpy.__version__, 'packaging', packaging.__version__)" >>"$OUT/env.txt" 2>&1
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
t0=$SECONDS
timeout 300 $PY -m pytest tests/test_softmax.py tests/test_mean.py tests/test_versions.py tests/test_components.py \
    -k "softmax or mean or version" --lane "$LANE" -n 8 --dist loadgroup -q -p no:cacheprovider -rfEsx >"$OUT/pytest.log" 2>&1
echo "pytest rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"; t0=$SECONDS
timeout 200 $PY -m batchinv.harness.cli sweep softmax log_softmax mean --lane "$LANE" --no-progress \
    --report "$OUT/sweep.jsonl" >"$OUT/sweep.log" 2>&1
echo "sweep rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"
cat "$OUT/env.txt"; tail -5 "$OUT/pytest.log"; tail -25 "$OUT/sweep.log"
