#!/usr/bin/env bash
# sm100 lane (Blackwell: B200, GB200): see ci/gpu_lane.sh.   PY=python3 bash ci/sm100.sh [OUTDIR]
LANE=sm100 exec bash "$(dirname "$0")/gpu_lane.sh" "$@"
