# shellcheck shell=bash
# Sourced by the device scripts (ci/device.sh, ci/gpu_lane.sh, ci/device_flashinfer.sh).
# `device_env OUTDIR [PY]` writes OUTDIR/env.txt (date, GPU, driver, memory, torch / CUDA /
# Triton / numpy / packaging versions) and sets unbuffered, wide output.
device_env() {
    local out=$1 py=${2:-python3}
    mkdir -p "$out"; export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-200}
    { date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      "$py" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
      "$py" -c "import numpy, packaging; print('numpy', numpy.__version__, 'packaging', packaging.__version__)"
    } >"$out/env.txt" 2>&1
}

# `timed NAME CAP CMD...`: run CMD with a wall-clock cap of CAP seconds, its command line and
# output in $OUT/NAME.log, and append "step NAME: rc=... in ...s (cap ...s)" to $OUT/steps.txt
# (and print it).  Returns CMD's exit status (124 when the cap stopped it).
timed() {
    local name=$1 cap=$2; shift 2; local t0; t0=$(date +%s%N)
    { printf '+'; printf ' %q' "$@"; echo; } >"$OUT/$name.log"
    timeout --signal=INT --kill-after=20 "$cap" "$@" >>"$OUT/$name.log" 2>&1; local rc=$?
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    echo "step $name: rc=$rc in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s (cap ${cap}s)" | tee -a "$OUT/steps.txt"
    return $rc
}
