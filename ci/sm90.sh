#!/usr/bin/env bash
# sm90 lane (Hopper: H100, H200): see ci/gpu_lane.sh.   PY=python3 bash ci/sm90.sh [OUTDIR]
LANE=sm90 exec bash "$(dirname "$0")/gpu_lane.sh" "$@"
