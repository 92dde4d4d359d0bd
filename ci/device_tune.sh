#!/usr/bin/env bash
# One device call: tuning scripts (each given OUTDIR), then `batchinv bench` of the named
# components, logs under OUTDIR.
#     bash ci/device_tune.sh OUTDIR "script1.py script2.py" "component1 component2"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; SCRIPTS=${2:-}; BENCH=${3:-}; mkdir -p "$OUT"
. ci/device_env.sh; device_env "$OUT" python3
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || true
for script in $SCRIPTS; do timed "$(basename "$script" .py)" 160 python3 "$script" "$OUT"; done
if [ -n "$BENCH" ]; then timed bench 150 python3 -m batchinv.harness.cli bench $BENCH --reps 20 --out "$OUT/bench"; fi
for script in $SCRIPTS; do tail -25 "$OUT/$(basename "$script" .py).log"; done
