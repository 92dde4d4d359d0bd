#!/usr/bin/env bash
# Sample the machine's load until killed: one CSV line every INTERVAL seconds (default 0.5) with
# the seconds since the start, the busy share of all CPUs over the interval (from /proc/stat),
# the 1-minute load average, and, where nvidia-smi answers, the GPU's utilization (the share of
# the interval a kernel ran), its memory used (MiB) and its SM clock (MHz).
#
#     bash ci/sample_load.sh OUT.csv [INTERVAL] &  SAMPLER=$!;  ...;  kill $SAMPLER
#
# What it tells apart: a sweep whose wall time is set by the CPUs (busy near 100%, GPU idle
# between launches) from one set by the GPU (utilization near 100%, CPUs waiting).
set -u
out=$1; interval=${2:-0.5}
gpu=0; command -v nvidia-smi >/dev/null 2>&1 && gpu=1
echo "seconds,cpu_busy_pct,load1,gpu_util_pct,gpu_mem_mib,sm_clock_mhz" >"$out"
read -r _ u n s i w q sq st _ </proc/stat
prev_busy=$((u + n + s + q + sq + st)); prev_total=$((prev_busy + i + w))
start=$(date +%s%N)
while :; do
    sleep "$interval"
    read -r _ u n s i w q sq st _ </proc/stat
    busy=$((u + n + s + q + sq + st)); total=$((busy + i + w))
    db=$((busy - prev_busy)); dt=$((total - prev_total)); prev_busy=$busy; prev_total=$total
    pct=0; [ "$dt" -gt 0 ] && pct=$((100 * db / dt))
    read -r load1 _ </proc/loadavg
    g=",,"
    if [ $gpu = 1 ]; then
        g=$(nvidia-smi --query-gpu=utilization.gpu,memory.used,clocks.sm --format=csv,noheader,nounits 2>/dev/null \
            | head -1 | tr -d ' ')
    fi
    ds=$((($(date +%s%N) - start) / 100000000))  # tenths of a second
    printf '%d.%d,%s,%s,%s\n' $((ds / 10)) $((ds % 10)) "$pct" "$load1" "$g" >>"$out"
done
