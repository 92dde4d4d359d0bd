#!/usr/bin/env bash
# One device call for the FP8 GEMM (issue 12): the sm90 sweep of the named components, then the
# FP8 tuning script; logs under OUTDIR.
#     bash ci/device_fp8.sh OUTDIR "component ..."
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; COMPONENTS=${2:-fp8_gemm}; mkdir -p "$OUT"
. ci/device_env.sh; device_env "$OUT" python3
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || true
timed sweep 300 python3 -m batchinv.harness.cli sweep $COMPONENTS --lane sm90 --no-progress --report "$OUT/sweep.jsonl"
timed tune_fp8_gemm 240 python3 ci/tune_fp8_gemm.py "$OUT"
tail -30 "$OUT/sweep.log"; grep -E "probe|best of|M=|==|error" "$OUT/tune_fp8_gemm.log" | head -80
