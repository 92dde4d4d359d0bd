#!/usr/bin/env bash
# One device call: decode_attention on a GPU lane -- its pytest file, its sweep and its bench --
# logs under OUTDIR.   PY=python3 LANE=sm90 bash ci/device_decode.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}; LANE=${LANE:-sm90}; OUT=${1:-out}
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" "$PY"
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1
t0=$SECONDS
timeout 200 $PY -m pytest tests/test_decode_attention.py --lane "$LANE" -n 8 -q -p no:cacheprovider -rfEsx >"$OUT/pytest.log" 2>&1
echo "pytest rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"; t0=$SECONDS
timeout 200 $PY -m batchinv.harness.cli bench decode_attention --lane "$LANE" --reps 20 --out "$OUT/bench" >"$OUT/bench.log" 2>&1
echo "bench rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"; t0=$SECONDS
timeout 150 $PY -m batchinv.harness.cli sweep decode_attention --lane "$LANE" --no-progress --report "$OUT/sweep.jsonl" >"$OUT/sweep.log" 2>&1
echo "sweep rc=$? $((SECONDS-t0))s" | tee -a "$OUT/steps.txt"
tail -5 "$OUT/pytest.log"; grep -E "fast|batch_planned|sdpa" "$OUT/bench.log" | head -80; tail -15 "$OUT/sweep.log"
