# Sourced by the device scripts: `device_env OUTDIR [PY]` writes OUTDIR/env.txt (date, GPU,
# driver, memory, torch/CUDA/Triton versions) and sets unbuffered, wide output.
device_env() {
    local out=$1 py=${2:-python3}
    mkdir -p "$out"; export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-200}
    { date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      "$py" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    } >"$out/env.txt" 2>&1
}
