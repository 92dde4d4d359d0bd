#!/usr/bin/env bash
# One device call, a focused re-check: `batchinv sweep` of the named components and pytest on
# the named test files (-k expression optional); logs under OUTDIR.
#     bash ci/device_check.sh OUTDIR "component ..." "tests/a.py tests/b.py" ["-k expr"]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; COMPONENTS=${2:-}; TESTS=${3:-}; KEXPR=${4:-}; mkdir -p "$OUT"
. ci/device_env.sh; device_env "$OUT" python3
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || true
timed sweep 150 python3 -m batchinv.harness.cli sweep $COMPONENTS --lane sm90 --no-progress --report "$OUT/sweep.jsonl"
timed pytest 150 python3 -m pytest -n 12 -q -p no:cacheprovider -rfEx --lane sm90 $TESTS ${KEXPR:+-k "$KEXPR"}
tail -12 "$OUT/sweep.log" | cut -c1-200; tail -6 "$OUT/pytest.log"; grep -E "^FAIL|FAILED" "$OUT/sweep.log" "$OUT/pytest.log" | head -20
