#!/usr/bin/env bash
# One device call: the environment header once, then the named steps in order, each under a
# wall-clock cap, its output in OUTDIR/NAME.log and its time in OUTDIR/steps.txt.
#
#     [PY=python3] [LANE=sm90] bash ci/device.sh OUTDIR STEP...
#
# A STEP is KIND[:ARG,ARG,...][@CAP]: the arguments are comma-separated (each one word for the
# command, spaces kept: "pytest:tests/components/test_mean.py,-k,modes or agreement"), CAP the step's cap in
# seconds (default per kind, below).  KINDs:
#
#   sweep[:ARGS]      batchinv sweep [--lane LANE] --no-progress --report OUTDIR/NAME.jsonl ARGS
#                     (ARGS: components, --subject ..., --jobs N ...; none: every component)  [200 s]
#   pytest[:ARGS]     pytest [--lane LANE] -n WORKERS --dist loadgroup -q -p no:cacheprovider
#                     -rfEsx ARGS (ARGS: test files, -k EXPR ...; none: the lane's tests)      [300 s]
#   bench[:ARGS]      batchinv bench [--lane LANE] --reps REPS --out OUTDIR/NAME ARGS
#                     (ARGS: components, --reps N ...; none: every component)                  [150 s]
#   audit[:T,ARGS]    batchinv audit T [--lane LANE] --out-dir OUTDIR ARGS (T: cublas)          [120 s]
#   tune:NAME[,ARGS]  python ci/tune_NAME.py [OUTDIR] ARGS; OUTDIR is given to the scripts that
#                     write there (matmul, fp8_gemm, log_softmax, topk_rows)                   [240 s]
#                     (matmul, fp8_gemm: TUNE_SHAPES, TUNE_DEADLINE_S, TUNE_SMOKE: ci/tuning.py)
#   make-sweep[:cold] make sweep PY=$PY SWEEP_ARGS="--no-progress --report OUTDIR/NAME.jsonl";
#                     cold: the Triton cache and make's install stamp removed first (the
#                     user's first run); NAME sweep-cold / sweep-warm                [240 s / 200 s]
#   make-test         make test PY=$PY PYTEST_ARGS="-n auto --dist loadgroup -q -p no:cacheprovider -rfEx"
#                                                                                              [300 s]
#   list              batchinv list                                                             [60 s]
#   cli:ARGS          python -m batchinv.harness.cli ARGS                                      [300 s]
#   sh:WORDS          bash -c "WORDS" (the words joined by spaces; @OUT@ is OUTDIR): a script of
#                     ci/ or the outside kit ("sh:bash ci/vllm_gpu.sh sweep @OUT@")          [300 s]
#
# NAME is the kind (tune_NAME for tune, sweep-cold / sweep-warm for make-sweep), with -2, -3
# ... on a repeat.  Every step is checked before the first runs (a typo costs no device time).
# Environment: PY (python3), LANE (unset: the lane is detected), WORKERS (8), REPS (20), TAIL (12:
# lines of each log printed at the end), NO_INSTALL=1 (skip the first step, `pip install
# --no-deps --no-build-isolation -e .` into PY, logged as install), DRY_RUN=1 (print the steps'
# commands and exit).  Exit status: 1 if any step failed or ran out of time, 2 on a bad STEP.
#
# Examples (the one-purpose scripts this replaced, and the runs they made: ci/README.md):
#   bash ci/device.sh OUT make-sweep:cold make-sweep make-test bench:matmul
#   LANE=sm90 bash ci/device.sh OUT sweep:fp8_gemm@300 tune:fp8_gemm
#   TUNE_DEADLINE_S=165 LANE=sm90 bash ci/device.sh OUT tune:matmul@220 tune:fp8_gemm@220
#   bash ci/device.sh OUT "pytest:tests/components/test_mean.py,-k,modes" sweep:mean,softmax
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
OUT=$1; shift
PY=${PY:-python3}; LANE=${LANE:-}; WORKERS=${WORKERS:-8}; REPS=${REPS:-20}; TAIL=${TAIL:-12}
TUNE_TAKES_OUT=" matmul fp8_gemm log_softmax topk_rows rows "
lane=(); [ -n "$LANE" ] && lane=(--lane "$LANE")

# plan SPEC: sets name, cap, cmd (the step's command line) and cold (1: clear the caches first)
# from one STEP; returns 1 (with a message) if the STEP is malformed.
declare -A seen
plan() {
    local spec=$1 kind rest base
    local -a args=()
    cap=""; cold=0; cmd=()
    if [[ $spec =~ ^(.*)@([0-9]+)$ ]]; then spec=${BASH_REMATCH[1]}; cap=${BASH_REMATCH[2]}; fi
    kind=${spec%%:*}; rest=""
    [[ $spec == *:* ]] && rest=${spec#*:}
    [ -n "$rest" ] && IFS=, read -r -a args <<<"$rest"
    case $kind in
        sweep) base=sweep; : "${cap:=200}"
            cmd=("$PY" -m batchinv.harness.cli sweep "${lane[@]}" --no-progress --report "$OUT/@NAME@.jsonl" "${args[@]}") ;;
        pytest) base=pytest; : "${cap:=300}"
            cmd=("$PY" -m pytest "${lane[@]}" -n "$WORKERS" --dist loadgroup -q -p no:cacheprovider -rfEsx "${args[@]}") ;;
        bench) base=bench; : "${cap:=150}"
            cmd=("$PY" -m batchinv.harness.cli bench "${lane[@]}" --reps "$REPS" --out "$OUT/@NAME@" "${args[@]}") ;;
        audit) base=audit; : "${cap:=120}"
            [ ${#args[@]} -gt 0 ] || args=(cublas)
            cmd=("$PY" -m batchinv.harness.cli audit "${args[0]}" "${lane[@]}" --out-dir "$OUT" "${args[@]:1}") ;;
        tune)
            if [ ${#args[@]} -eq 0 ] || [ ! -f "ci/tune_${args[0]}.py" ]; then
                echo "$1: no ci/tune_${args[0]:-}.py" >&2; return 1
            fi
            base=tune_${args[0]}; : "${cap:=240}"
            cmd=("$PY" "ci/tune_${args[0]}.py")
            [[ $TUNE_TAKES_OUT == *" ${args[0]} "* ]] && cmd+=("$OUT")
            cmd+=("${args[@]:1}") ;;
        make-sweep)
            case $rest in
                cold) base=sweep-cold; cold=1; : "${cap:=240}" ;;
                "") base=sweep-warm; : "${cap:=200}" ;;
                *) echo "$1: make-sweep takes :cold or nothing" >&2; return 1 ;;
            esac
            cmd=(make sweep "PY=$PY" "SWEEP_ARGS=--no-progress --report $OUT/@NAME@.jsonl") ;;
        make-test) base=make-test; : "${cap:=300}"
            [ -z "$rest" ] || { echo "$1: make-test takes no arguments" >&2; return 1; }
            cmd=(make test "PY=$PY" "PYTEST_ARGS=-n auto --dist loadgroup -q -p no:cacheprovider -rfEx") ;;
        list) base=list; : "${cap:=60}"
            [ -z "$rest" ] || { echo "$1: list takes no arguments" >&2; return 1; }
            cmd=("$PY" -m batchinv.harness.cli list) ;;
        cli) base=cli; : "${cap:=300}"
            [ ${#args[@]} -gt 0 ] || { echo "$1: cli needs arguments" >&2; return 1; }
            cmd=("$PY" -m batchinv.harness.cli "${args[@]}") ;;
        sh) base=sh; : "${cap:=300}"
            [ ${#args[@]} -gt 0 ] || { echo "$1: sh needs a command" >&2; return 1; }
            cmd=(bash -c "${args[*]//@OUT@/$OUT}") ;;
        *) echo "$1: unknown step kind '$kind' (sweep pytest bench audit tune make-sweep make-test list cli sh)" >&2
            return 1 ;;
    esac
    seen[$base]=$(( ${seen[$base]:-0} + 1 ))
    name=$base; [ "${seen[$base]}" -gt 1 ] && name=$base-${seen[$base]}
    cmd=("${cmd[@]//@NAME@/$name}")
    return 0
}

for spec in "$@"; do plan "$spec" || exit 2; done
seen=()
if [ "${DRY_RUN:-0}" = 1 ]; then
    for spec in "$@"; do
        plan "$spec"; note=""; [ "$cold" = 1 ] && note=", caches cleared first"
        printf '%s (cap %ss%s):' "$name" "$cap" "$note"; printf ' %q' "${cmd[@]}"; echo
    done
    exit 0
fi

mkdir -p "$OUT"
. ci/device_env.sh; device_env "$OUT" "$PY"
status=0
names=()
if [ "${NO_INSTALL:-0}" != 1 ]; then
    timed install 120 "$PY" -m pip install -q --no-deps --no-build-isolation -e . || status=1
fi
for spec in "$@"; do
    plan "$spec"
    if [ "$cold" = 1 ]; then rm -rf "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" ".stamp-$(basename "$PY")"; fi
    timed "$name" "$cap" "${cmd[@]}" || status=1
    names+=("$name")
done
logs=()
for n in "${names[@]}"; do echo "== $n"; tail -n "$TAIL" "$OUT/$n.log" | cut -c1-240; logs+=("$OUT/$n.log"); done
grep -hE "^(FAILED|ERROR) " "${logs[@]}" /dev/null | head -20
echo "== steps"; cat "$OUT/steps.txt"
exit $status
