#!/usr/bin/env bash
# vLLM's batch-invariant kernels swept on a GPU lane without the vLLM wheel on the device.
#
#   bash ci/vllm_gpu.sh prepare          # dev machine (PyPI): the shim in .vllm-shim/ (~200 KB, git-ignored)
#   bash ci/vllm_gpu.sh sweep [OUTDIR]   # device: the five subjects on the GPU lane through the shim
#   bash ci/vllm_gpu.sh cpu [OUTDIR]     # dev machine: the same sweep on the cpu lane (Triton interpreter)
#   bash ci/vllm_gpu.sh repro [OUTDIR]   # device: docs/upstream/vllm-mean-row-start.md's repro (ci/vllm_mean_repro.py)
#
# prepare: `pip download vllm==0.32.0 --no-deps` (327 MB, kept in .vllm-wheel/ for the next run),
# then ci/vllm_shim.py copies vLLM's batch_invariant.py, batch_invariant_configs.py and
# ir/ops/layernorm.py byte for byte under vLLM's module paths and writes stand-ins for the
# vllm-internal modules they import (.vllm-shim/SHIM.json: the wheel's and the files' sha256).
# The device tool carries the checkout and the ignored paths named in carry: carry [".vllm-shim"].
#
# sweep / cpu: batchinv sweep of matmul softmax log_softmax mean rms_norm with vLLM's kernels as
# subjects (role fast) and vLLM's default paths (role baseline) from batchinv.harness.adapters.vllm,
# every case (--profile full), PYTHONPATH=.vllm-shim; the report is OUTDIR/vllm-sweep-LANE.jsonl
# (default OUTDIR: reports), its log beside it, then ci/vllm_summary.py's table (its KNOWN findings
# are the cpu lane's: on a GPU lane a failure outside them, such as mean's row_start, is printed
# FAILED and the exit status is 1 -- the finding, not a broken run).
#
# Environment: PY (default python3 on the device, .venv/bin/python here when it exists), LANE
# (sweep: default detected), JOBS (default 4 on a GPU lane, 2 on the cpu lane), VLLM_SPEC
# (default vllm==0.32.0), SHIM (default .vllm-shim).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
SHIM=${SHIM:-.vllm-shim}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.32.0}
if [[ -z ${PY:-} ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
COMPONENTS=(matmul softmax log_softmax mean rms_norm)

case $mode in
prepare)
    t0=$(date +%s)
    mkdir -p .vllm-wheel
    wheel=$(ls .vllm-wheel/vllm-"${VLLM_SPEC#vllm==}"-*.whl 2>/dev/null | head -1 || true)
    if [[ -z $wheel ]]; then
        "$PY" -m pip download -q --no-deps "$VLLM_SPEC" -d .vllm-wheel
        wheel=$(ls .vllm-wheel/vllm-"${VLLM_SPEC#vllm==}"-*.whl | head -1)
    fi
    rm -rf "$SHIM"
    "$PY" ci/vllm_shim.py "$wheel" "$SHIM"
    # the import check: vLLM's module through the shim, on this machine's lane (cpu here)
    PYTHONPATH="$SHIM" TRITON_INTERPRET=${TRITON_INTERPRET:-1} "$PY" -c \
        "import batchinv.harness.adapters.vllm as v; print('vllm_gpu.sh: imports', v.load().__file__)"
    echo "vllm_gpu.sh: $SHIM ready ($(du -sh "$SHIM" | cut -f1)) in $(($(date +%s) - t0)) s; carry [\"$SHIM\"]"
    ;;
sweep | cpu)
    OUTDIR=${2:-reports}
    mkdir -p "$OUTDIR"
    [[ -f $SHIM/SHIM.json ]] || { echo "vllm_gpu.sh: no $SHIM (run 'bash ci/vllm_gpu.sh prepare' first)" >&2; exit 2; }
    lane=()
    if [[ $mode == cpu ]]; then lane=(--lane cpu); elif [[ -n ${LANE:-} ]]; then lane=(--lane "$LANE"); fi
    jobs=${JOBS:-$([[ $mode == cpu ]] && echo 2 || echo 4)}
    SUBJECTS=()
    for name in "${COMPONENTS[@]}"; do
        SUBJECTS+=(--subject "vllm=batchinv.harness.adapters.vllm:$name")
        SUBJECTS+=(--subject "vllm_default=batchinv.harness.adapters.vllm:${name}_default")
    done
    tag=${LANE:-$([[ $mode == cpu ]] && echo cpu || echo gpu)}
    REPORT="$OUTDIR/vllm-sweep-$tag.jsonl"
    cp "$SHIM/SHIM.json" "$OUTDIR/vllm-shim.json"
    t0=$(date +%s)
    set +e
    PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" "$PY" -W ignore::RuntimeWarning -m batchinv.harness.cli sweep \
        "${COMPONENTS[@]}" "${SUBJECTS[@]}" "${lane[@]}" --profile full --no-progress --jobs "$jobs" \
        --report "$REPORT" >"$REPORT.log" 2>&1
    rc=$?
    set -e
    echo "vllm_gpu.sh: sweep exit $rc in $(($(date +%s) - t0)) s; report $REPORT, log $REPORT.log"
    tail -n 3 "$REPORT.log"
    status=0
    "$PY" ci/vllm_summary.py "$REPORT" | tee "$OUTDIR/vllm-summary-$tag.txt" || status=${PIPESTATUS[0]}
    exit $status
    ;;
repro)
    OUTDIR=${2:-reports}
    mkdir -p "$OUTDIR"
    [[ -f $SHIM/SHIM.json ]] || { echo "vllm_gpu.sh: no $SHIM (run 'bash ci/vllm_gpu.sh prepare' first)" >&2; exit 2; }
    PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" "$PY" -W ignore::RuntimeWarning ci/vllm_mean_repro.py \
        "$OUTDIR/vllm-mean-repro.txt"
    ;;
*)
    sed -n '2,7p' "$0" >&2
    exit 2
    ;;
esac
