#!/usr/bin/env bash
# The vLLM adapter lane (cpu): vLLM's batch-invariant Triton kernels swept as subjects of the
# matching components, vLLM's default paths as baselines (batchinv.harness.adapters.vllm).
#
#   bash ci/vllm.sh            # builds .vllm-venv the first time (reused after), then tests + sweep
#
# vLLM pins torch exactly (0.27.0-0.32.0: torch==2.13.0, this project's torch); installed with
# --no-deps it imports with five small extra packages.  The wheel is about 300 MB (downloaded once
# per fresh checkout: see ci/README.md for the time).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.vllm-venv}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.32.0}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
t0=$(date +%s)
if [ ! -f "$VENV/.installed" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
    "$VENV/bin/python" -m pip install -q -e .
    "$VENV/bin/python" -m pip install -q --no-deps "$VLLM_SPEC"
    "$VENV/bin/python" -m pip install -q packaging psutil pyzmq urllib3 regex
    touch "$VENV/.installed"
fi
t1=$(date +%s)
echo "vllm.sh: venv ready in $((t1 - t0)) s ($("$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "torch", m.version("torch"), "triton", m.version("triton"))'))"

# The adapter's tests (the vLLM-needing ones run here) and the packaging check that the harness
# never imports vLLM (it has teeth here, where vLLM is installed).
"$VENV/bin/python" -m pytest -q -p no:randomly -p no:cacheprovider tests/integration/test_vllm_adapter.py \
    "tests/integration/test_layers.py::test_harness_import_never_pulls_vllm_or_flashinfer"
t2=$(date +%s)

# vLLM's invariant kernels (role fast) and default paths (role baseline) on the cpu lane.
SUBJECTS=()
for name in matmul softmax log_softmax mean rms_norm; do
    SUBJECTS+=(--subject "vllm=batchinv.harness.adapters.vllm:$name")
    SUBJECTS+=(--subject "vllm_default=batchinv.harness.adapters.vllm:${name}_default")
done
mkdir -p reports
REPORT=${VLLM_REPORT:-reports/vllm-sweep-cpu.jsonl}
set +e
"$VENV/bin/python" -W ignore::RuntimeWarning -m batchinv.harness.cli sweep matmul softmax log_softmax mean rms_norm \
    "${SUBJECTS[@]}" --lane cpu --profile full --no-progress --jobs "${JOBS:-2}" --report "$REPORT" >"$REPORT.log" 2>&1
set -e
t3=$(date +%s)
echo "vllm.sh: sweep log in $REPORT.log"
status=0
"$VENV/bin/python" ci/vllm_summary.py "$REPORT" || status=$?
echo "vllm.sh: venv $((t1 - t0)) s, tests $((t2 - t1)) s, sweep $((t3 - t2)) s, total $((t3 - t0)) s"
exit $status
