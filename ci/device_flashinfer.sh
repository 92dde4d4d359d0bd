#!/usr/bin/env bash
# One device call: FlashInfer's FP8 bmm (batchinv.harness.adapters.flashinfer) on the H200 -- the
# seed's table (ci/flashinfer_table.py) and the fp8_gemm sweep of the adapter's subjects -- logs
# under OUTDIR.  The wheels come in .whl/ (python3 ci/flashinfer_wheels.py .whl, here; the run
# carries ".whl"):
#   PY=python3 LANE=sm90 bash ci/device_flashinfer.sh OUTDIR
# FlashInfer compiles its cuBLAS bmm module with nvcc on the first call (ninja; cached under
# ~/.cache/flashinfer for the sweep's workers after).  SUBJECTS overrides the swept subjects.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; LANE=${LANE:-sm90}; OUT=${1:-out}
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" "$PY"
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >>"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/site
{ $PY -c "import flashinfer, importlib.metadata as m; print('flashinfer', flashinfer.__version__, m.version('flashinfer-python'))"
  $PY -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())"
  echo "nvcc: $(command -v nvcc || echo missing) $(nvcc --version 2>/dev/null | tail -1)"
} 2>&1 | tee -a "$OUT/env.txt"
t0=$SECONDS
timeout 360 $PY ci/flashinfer_table.py "$OUT" 2>&1 | tee "$OUT/table.log"
echo "table rc=${PIPESTATUS[0]} $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"; t0=$SECONDS
SUBJECTS=${SUBJECTS:-cutlass cublas_autotuned auto_autotuned}
ARGS=(); for s in $SUBJECTS; do ARGS+=(--subject "$s=batchinv.harness.adapters.flashinfer:$s"); done
timeout 150 $PY -m batchinv.harness.cli sweep fp8_gemm --lane "$LANE" --no-progress --jobs "${JOBS:-4}" \
    "${ARGS[@]}" --report "$OUT/sweep.jsonl" >"$OUT/sweep.log" 2>&1
echo "sweep rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"
tail -30 "$OUT/sweep.log"
