#!/usr/bin/env bash
# One device call, as a user runs it on a GPU machine: `make sweep PY=python3` with a cold Triton
# cache, again warm, then `make test PY=python3` (the pytest lane), each timed end to end; logs
# under OUTDIR.     bash ci/device_full_lane.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 COLUMNS=200
. ci/device_env.sh; device_env "$OUT" python3
rm -rf ~/.triton/cache .stamp-python3
timed sweep-cold 240 make sweep PY=python3 SWEEP_ARGS="--no-progress --report $OUT/sweep-cold.jsonl"
timed sweep-warm 200 make sweep PY=python3 SWEEP_ARGS="--no-progress"
timed pytest 300 make test PY=python3 PYTEST_ARGS="-n auto --dist loadgroup -q -p no:cacheprovider -rfEx"
for f in sweep-cold sweep-warm; do tail -3 "$OUT/$f.log"; done; tail -4 "$OUT/pytest.log"; grep -E "FAILED|ERROR" "$OUT/pytest.log" | head -20
