#!/usr/bin/env bash
# The vLLM adapter lane (cpu): vLLM's batch-invariant Triton kernels swept as subjects of the
# matching components, vLLM's default paths as baselines (batchinv.fast.adapters.vllm).
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
