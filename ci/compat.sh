#!/usr/bin/env bash
# Compatibility lane: the cpu lane (Triton interpreter) under each supported Triton, as a table.
#
#   bash ci/compat.sh [--quick] [TRITON_VERSION...]    (default: 3.6.0 3.7.1 3.8.0 3.9.0)
#
# Per Triton: the kernel tests (every component's test file, KERNEL_TESTS below) and the cpu-lane
# sweep (`batchinv sweep --lane cpu`, every component and baseline; --quick: COMPAT_QUICK_SWEEP,
# the components whose kernels share the reduction helpers, M cut at 16).  .ci/run runs
# `--quick 3.6.0 3.9.0` (the oldest and the newest); docs/COMPAT.md has the full table.
#
# Each Triton gets a venv .compat/triton-X layered on the project's .venv (built by `make` if
# absent): `python -m venv --without-pip`, a .pth that appends .venv's site-packages (torch, the
# editable batchinv, pytest...) after its own, and `triton==X` plus the numpy that Triton's
# interpreter takes installed --no-deps into its own site-packages, where they shadow .venv's.
# torch is .venv's (TORCH_SPEC, torch 2.13.0 CPU here): the torch releases that bring Triton 3.7-3.9
# have no CPU wheel on PyPI (their Linux wheels are multi-GB CUDA builds), so each Triton runs
# beside that torch.  A venv already there with the right versions is reused.
#
# Environment: COMPAT_JOBS (xdist workers and sweep jobs, default 2), COMPAT_SWEEP_ARGS (extra
# sweep arguments), COMPAT_TABLE (where the markdown table goes, default .compat/table.md).
# Exit status: 0 when every Triton passes both steps, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
if [[ "${1:-}" == "--quick" ]]; then
    QUICK=1
    shift
fi
VERSIONS=("$@")
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=(3.6.0 3.7.1 3.8.0 3.9.0)
JOBS=${COMPAT_JOBS:-2}
COMPAT_QUICK_SWEEP=${COMPAT_QUICK_SWEEP:-softmax log_softmax mean rms_norm --max-m 16}
KERNEL_TESTS=(
    tests/components/test_topk.py tests/components/test_matmul.py tests/components/test_rms_norm.py tests/components/test_softmax.py
    tests/components/test_mean.py tests/components/test_decode_attention.py tests/components/test_swiglu.py tests/components/test_grouped_gemm.py
    tests/components/test_grouped_gemm_arguments.py tests/components/test_fused_moe.py tests/components/test_moe_router.py
    tests/integration/test_ops.py tests/integration/test_enable.py tests/integration/test_versions.py
)
OUT=.compat
TABLE=${COMPAT_TABLE:-$OUT/table.md}
mkdir -p "$OUT"

[[ -x .venv/bin/python ]] || make .venv/.installed
BASE_SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BASE_PYTHON=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')

numpy_for() {  # the numpy each Triton's interpreter takes (fast/versions.py)
    case "$1" in
        3.6.*) echo "numpy>=1.26,<2.4" ;;
        *) echo "numpy>=2.4" ;;
    esac
}

build_venv() {  # build_venv VERSION DIR: the layered venv, reused when its versions are right
    local version=$1 dir=$2 site
    if [[ -x $dir/bin/python ]] && [[ "$("$dir/bin/python" -c 'import triton; print(triton.__version__)' 2>/dev/null)" == "$version" ]]; then
        return 0
    fi
    rm -rf "$dir"
    "$BASE_PYTHON" -m venv --without-pip "$dir"
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$BASE_SITE')" >"$site/_batchinv_base.pth"
    .venv/bin/python -m pip --python "$dir/bin/python" install -q --no-deps \
        "triton==$version" "$(numpy_for "$version")" 2>&1 | grep -v "is ignored: it is neither" || true
    "$dir/bin/python" -c 'import triton' # fails loudly if the install did
}

now() { date +%s; }
ROWS=()
STATUS=0
for version in "${VERSIONS[@]}"; do
    dir=$OUT/triton-$version
    log=$OUT/triton-$version.log
    t0=$(now)
    build_venv "$version" "$dir"
    t1=$(now)
    found=$("$dir/bin/python" -c 'import numpy, torch, triton; print(torch.__version__, triton.__version__, numpy.__version__)')
    read -r torch_v triton_v numpy_v <<<"$found"
    echo "== Triton $triton_v, torch $torch_v, numpy $numpy_v ($dir, built in $((t1 - t0)) s)"

    tests_ok=0
    "$dir/bin/python" -m pytest "${KERNEL_TESTS[@]}" -q -p no:cacheprovider --lane cpu \
        -n "$JOBS" --dist loadgroup >"$log" 2>&1 || tests_ok=$?
    t2=$(now)
    tests_line=$(grep -E '^[0-9]+ (passed|failed)|[0-9]+ (passed|failed|error)' "$log" | tail -1 | sed 's/^=* *//; s/ *=*$//')
    echo "   kernel tests: ${tests_line:-no summary (see $log)} ($((t2 - t1)) s)"

    sweep_args=()
    if [[ $QUICK == 1 ]]; then
        read -ra sweep_args <<<"$COMPAT_QUICK_SWEEP"
    fi
    read -ra extra <<<"${COMPAT_SWEEP_ARGS:-}"
    sweep_ok=0
    rm -f "$OUT/sweep-$version.jsonl"
    "$dir/bin/python" -m batchinv.harness.cli sweep --lane cpu --profile full --no-progress --jobs "$JOBS" \
        --report "$OUT/sweep-$version.jsonl" "${sweep_args[@]}" "${extra[@]}" >>"$log" 2>&1 || sweep_ok=$?
    t3=$(now)
    checks=$(.venv/bin/python ci/compat_summary.py "$OUT/sweep-$version.jsonl" 2>/dev/null || echo "no report")
    sweep_word=$([[ $sweep_ok == 0 ]] && echo OK || echo "FAILED (exit $sweep_ok)")
    echo "   sweep: $sweep_word, checks: $checks ($((t3 - t2)) s)"
    verdict=$([[ $tests_ok == 0 && $sweep_ok == 0 ]] && echo pass || echo FAIL)
    [[ $verdict == pass ]] || STATUS=1
    ROWS+=("| $triton_v | $torch_v | $numpy_v | ${tests_line} ($((t2 - t1)) s) | $sweep_word: $checks ($((t3 - t2)) s) | $verdict | $((t3 - t0)) s |")
done

mode=$([[ $QUICK == 1 ]] && echo "quick: sweep $COMPAT_QUICK_SWEEP" || echo "full: every component and baseline")
{
    echo "cpu lane (Triton interpreter), $(date -u +%Y-%m-%d), $(uname -m), $(nproc) cores, jobs $JOBS, sweep ${mode}${COMPAT_SWEEP_ARGS:+ $COMPAT_SWEEP_ARGS}"
    echo
    echo "| triton | torch | numpy | kernel tests | sweep (fast cases by status; negative controls by verdict) | result | time |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
} >"$TABLE"
echo
cat "$TABLE"
exit $STATUS
