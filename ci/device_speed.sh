#!/usr/bin/env bash
# One device call for the speed issue: the matmul tuning run (ci/tune_matmul.py), then the matmul
# GPU lane (its pytest file, config_equivalence's tests, `batchinv sweep matmul`), logs under OUTDIR.
#     bash ci/device_speed.sh OUTDIR [extra tune scripts...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; shift || true; mkdir -p "$OUT"
. ci/device_env.sh; device_env "$OUT" python3
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || true
timed tune-matmul 330 python3 ci/tune_matmul.py "$OUT"
for script in "$@"; do timed "$(basename "$script" .py)" 150 python3 "$script" "$OUT"; done
timed sweep-matmul 150 python3 -m batchinv.harness.cli sweep matmul --no-progress --report "$OUT/sweep-matmul.jsonl"
timed pytest-matmul 150 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEx tests/test_matmul.py tests/test_harness_config_equivalence.py
tail -5 "$OUT/sweep-matmul.log"; tail -3 "$OUT/pytest-matmul.log"; grep -E "FAILED|ERROR" "$OUT/pytest-matmul.log" | head
