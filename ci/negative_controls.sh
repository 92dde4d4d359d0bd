#!/usr/bin/env bash
# Only the negative controls, on the detected lane (or LANE=...): each baseline must fail an
# invariance check (strict xfail); an XPASS means the harness stopped detecting variance.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LANE_ARG=${LANE:+--lane $LANE}
make "$( [ "$PY" = .venv/bin/python ] && echo .venv/.installed || echo .stamp-$(basename "$PY") )" PY="$PY"
$PY -m pytest -n auto -m negative_control $LANE_ARG
