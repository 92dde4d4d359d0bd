#!/usr/bin/env bash
# One cold `make sweep` of the checkout, or of the checkout with a candidate patch applied, with
# ci/sample_load.sh sampling the machine beside it: one device call of a sweep-time A/B
# (docs/DEVICE_RUNS.md).  The patch is reverted when the script ends, however it ends.
#
#     bash ci/sweep_variant.sh OUTDIR [PATCH] [CAP_SECONDS]
#
# Writes OUTDIR/load.csv (the sampler), OUTDIR/variant.txt (the patch applied, or "main") and
# ci/device.sh's files (sweep-cold.log, sweep-cold.jsonl, steps.txt, env.txt).  CAP_SECONDS
# (default 330) is the sweep step's cap.  Exit status: device.sh's; 2 when the patch does not apply.
set -u
out=$1; patch=${2:-}; cap=${3:-330}
cd "$(dirname "$0")/.."
mkdir -p "$out"
if [ -n "$patch" ]; then
    git apply --check "$patch" || { echo "$patch does not apply to this checkout" >&2; exit 2; }
    git apply "$patch"
    trap 'git apply -R "$patch"' EXIT
    echo "$patch" >"$out/variant.txt"
else
    echo main >"$out/variant.txt"
fi
bash ci/sample_load.sh "$out/load.csv" 0.5 &
sampler=$!
bash ci/device.sh "$out" "make-sweep:cold@$cap"
status=$?
kill "$sampler" 2>/dev/null
exit "$status"
