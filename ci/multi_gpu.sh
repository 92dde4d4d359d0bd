#!/usr/bin/env bash
# The multi-GPU lane (issue 29): the gpu_2 / gpu_4 tests under torchrun, one rank per GPU, over
# NCCL, with NVLink multicast off (NVLS and symmetric-memory multicast: the lent H200 hosts do not
# offer it reliably; docs/DESIGN.md, "Lanes").  Every rank runs the same pytest selection, so the
# collectives of the tests meet; each rank judges its own results.  Not yet run: no multi-GPU
# machine was lent when it was written (docs/DEVICE_RUNS.md records the first run).
#
#   ci/multi_gpu.sh              # world sizes 2 and 4, those the GPU count allows
#   PY=python3 ci/multi_gpu.sh   # the image's python
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
status=0
for n in 2 4; do
  if [ "$gpus" -lt "$n" ]; then
    echo "multi_gpu: gpu_$n not run: $gpus GPU(s) visible"
    continue
  fi
  echo "multi_gpu: gpu_$n on $n of $gpus GPUs"
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" \
    -m pytest -q -p no:cacheprovider -m "gpu_$n" tests/components/test_all_reduce_multi_gpu.py || status=1
done
exit $status
