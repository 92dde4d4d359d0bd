#!/usr/bin/env bash
# One device call, the final check of a change: `make sweep PY=python3` with a cold Triton cache,
# `make test PY=python3`, then `batchinv bench` of the named components; logs under OUTDIR.
#     bash ci/device_final_lane.sh OUTDIR "component ..."
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; BENCH=${2:-}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" python3
rm -rf ~/.triton/cache .stamp-python3
timed sweep-cold 240 make sweep PY=python3 SWEEP_ARGS="--no-progress --report $OUT/sweep-cold.jsonl"
timed pytest 300 make test PY=python3 PYTEST_ARGS="-n auto --dist loadgroup -q -p no:cacheprovider -rfEx"
if [ -n "$BENCH" ]; then timed bench 150 python3 -m batchinv.harness.cli bench $BENCH --reps 20 --out "$OUT/bench"; fi
tail -3 "$OUT/sweep-cold.log"; tail -4 "$OUT/pytest.log"; grep -E "FAILED|ERROR" "$OUT/pytest.log" | head -20
