"""ci/vllm_shim.py on a stand-in wheel (the real one is 327 MB): the files are copied byte for
byte under vLLM's module paths, the vllm-internal modules they import are provided and import,
a top-level import the shim lacks is refused, and the manifest names every file's sha256.  The
real wheel goes through the same code in ``bash ci/vllm_gpu.sh prepare``."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("vllm_shim", ROOT / "ci" / "vllm_shim.py")
assert spec is not None and spec.loader is not None
vllm_shim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vllm_shim)

#: The import lines of vLLM 0.32.0's batch_invariant.py (lines 8-22), and a function using each.
BATCH_INVARIANT = """import torch
import torch.distributed as dist

import vllm.envs as envs
from vllm.model_executor.determinism.batch_invariant_configs import (
    resolve_tuned_matmul_configs,
)
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.utils.mem_utils import get_max_shared_memory_bytes
from vllm.utils.nccl import pin_nccl_env
from vllm.utils.platform_utils import num_compute_units
from vllm.utils.torch_utils import is_torch_equal_or_newer


def probe():
    import vllm._custom_ops as ops  # inside a function, as vLLM's residual path: allowed

    return {
        "mode": envs.VLLM_BATCH_INVARIANT,
        "key": current_platform.dispatch_key,
        "units": num_compute_units(None) > 0,
        "torch": is_torch_equal_or_newer("2.0.0"),
        "tl": tl.constexpr is not None and triton.jit is not None,
        "tuned": resolve_tuned_matmul_configs(),
    }
"""
CONFIGS = """from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability


def resolve_tuned_matmul_configs():
    return current_platform.get_device_capability() is None and DeviceCapability(9, 0).to_int() == 90
"""
LAYERNORM = """import torch

from ..op import register_op


@register_op
def rms_norm(x, weight, epsilon, variance_size=None):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon) * weight


@register_op(allow_inplace=True)
def fused_add_rms_norm(x, r, weight, epsilon):
    return rms_norm(x + r, weight, epsilon), x + r


rms_norm.override_tolerance(torch.float16, atol=1e-2, rtol=2e-3)
"""


def _wheel(tmp_path: Path, files: dict[str, str]) -> Path:
    wheel = tmp_path / "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("vllm-0.32.0.dist-info/licenses/LICENSE", "Apache-2.0 (stand-in)")
    return wheel


def _files() -> dict[str, str]:
    return {
        "vllm/model_executor/determinism/batch_invariant.py": BATCH_INVARIANT,
        "vllm/model_executor/determinism/batch_invariant_configs.py": CONFIGS,
        "vllm/ir/ops/layernorm.py": LAYERNORM,
        "vllm/distributed/__init__.py": "raise ImportError('not copied')",
    }


def test_the_shim_copies_the_files_and_provides_their_imports(tmp_path):
    out = tmp_path / "shim"
    manifest = vllm_shim.build(_wheel(tmp_path, _files()), out)
    for path, text in _files().items():
        if path.startswith("vllm/distributed"):
            assert not (out / path).exists()  # only what the adapter runs is copied
            continue
        assert (out / path).read_text() == text
        assert manifest["copied"][path] == hashlib.sha256(text.encode()).hexdigest()
    assert json.loads((out / "SHIM.json").read_text()) == manifest
    code = (
        "import json, vllm\n"
        "from vllm.model_executor.determinism import batch_invariant as bi\n"
        "from vllm import ir\n"
        "import torch\n"
        "x = torch.ones(2, 4)\n"
        "print(json.dumps({**{k: v for k, v in bi.probe().items() if k != 'mode'}, 'v': vllm.__version__,"
        " 'norm': float(ir.ops.rms_norm(x, torch.ones(4), 0.0, None).sum())}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={
            "PYTHONPATH": str(out),
            "TRITON_INTERPRET": "1",
            "PATH": "/usr/bin:/bin",
            "CUDA_VISIBLE_DEVICES": "",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    # probe() imports vllm._custom_ops, which the shim does not have: that path alone fails
    assert proc.returncode == 1 and "vllm._custom_ops" in proc.stderr, proc.stderr


def test_the_shim_imports_without_the_compiled_extension(tmp_path):
    files = _files()
    files["vllm/model_executor/determinism/batch_invariant.py"] = BATCH_INVARIANT.replace(
        "    import vllm._custom_ops as ops  # inside a function, as vLLM's residual path: allowed\n", ""
    )
    out = tmp_path / "shim"
    vllm_shim.build(_wheel(tmp_path, files), out)
    code = (
        "import json, vllm, torch\n"
        "from vllm.model_executor.determinism import batch_invariant as bi\n"
        "from vllm import ir\n"
        "print(json.dumps({**bi.probe(), 'v': vllm.__version__,"
        " 'norm': float(ir.ops.rms_norm(torch.ones(2, 4), torch.ones(4), 0.0, None).sum())}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={
            "PYTHONPATH": str(out),
            "TRITON_INTERPRET": "1",
            "VLLM_BATCH_INVARIANT": "1",
            "PATH": "/usr/bin:/bin",
            "CUDA_VISIBLE_DEVICES": "",  # the CPU path the expectations are for, also on a GPU runner
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "mode": True,
        "key": "CPU",
        "units": True,
        "torch": True,
        "tl": True,
        "tuned": True,
        "v": "0.32.0+batchinv-shim",
        "norm": 8.0,
    }


def test_a_top_level_import_the_shim_lacks_is_refused(tmp_path):
    files = _files()
    files["vllm/model_executor/determinism/batch_invariant.py"] = (
        "from vllm.distributed import get_tp_group\n" + BATCH_INVARIANT
    )
    with pytest.raises(SystemExit, match=r"vllm\.distributed"):
        vllm_shim.build(_wheel(tmp_path, files), tmp_path / "shim")
    files = _files()
    del files["vllm/ir/ops/layernorm.py"]
    with pytest.raises(SystemExit, match=r"has no vllm/ir/ops/layernorm\.py"):
        vllm_shim.build(_wheel(tmp_path, files), tmp_path / "shim2")
