#!/usr/bin/env bash
# cpu lane: every test that runs in the Triton interpreter (no GPU needed), then the full sweep
# (every case; `make sweep` alone runs the quick profile).
# Where: any machine.  CI (.ci/run -> make test) runs the same tests, not the sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
make test PYTEST_ARGS="-n auto --dist loadgroup --lane cpu"
make sweep-full SWEEP_ARGS="--lane cpu --no-progress"
