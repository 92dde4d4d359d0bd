#!/usr/bin/env bash
# One device call: `make sweep PY=python3` with a cold Triton cache (the main job as a user runs
# it), then `batchinv bench` of the named components; logs under OUTDIR.
#     bash ci/device_sweep_bench.sh OUTDIR "component ..."
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; BENCH=${2:-}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" python3
rm -rf ~/.triton/cache .stamp-python3
timed sweep-cold 270 make sweep PY=python3 SWEEP_ARGS="--no-progress --report $OUT/sweep-cold.jsonl"
if [ -n "$BENCH" ]; then timed bench 90 python3 -m batchinv.harness.cli bench $BENCH --reps 20 --out "$OUT/bench"; fi
tail -4 "$OUT/sweep-cold.log"; grep -E "^FAIL|ERROR" "$OUT/sweep-cold.log" | head -10
