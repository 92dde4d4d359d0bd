"""Build a small ``vllm`` package holding vLLM's batch-invariant module, for a machine without vLLM.

    python ci/vllm_shim.py WHEEL OUT_DIR

From vLLM's wheel (``pip download vllm==0.32.0 --no-deps``; 327 MB, too large to carry to the
device) it copies, byte for byte, the files the adapter (``batchinv.harness.adapters.vllm``)
runs, under vLLM's own module paths:

* ``vllm/model_executor/determinism/batch_invariant.py`` and ``batch_invariant_configs.py``:
  the batch-invariant Triton kernels, launchers and tuned tile tables;
* ``vllm/ir/ops/layernorm.py``: vLLM's native torch RMSNorm (``vllm.ir.ops.rms_norm``), the
  rms_norm baseline (vLLM's path without the mode).

and writes stand-ins for the vllm-internal modules those files import (nothing else of vLLM is
present): ``vllm.envs`` (``VLLM_BATCH_INVARIANT`` read from the environment), ``vllm.platforms``
(``current_platform``: CUDA when torch sees a GPU, else CPU), ``vllm.platforms.interface``
(``DeviceCapability``), ``vllm.triton_utils`` (the real triton), ``vllm.utils.mem_utils``,
``vllm.utils.nccl``, ``vllm.utils.platform_utils``, ``vllm.utils.torch_utils`` and
``vllm.ir.op`` (``register_op``: the function itself, no dispatch).  ``vllm._custom_ops`` (the
compiled extension, used only by ``rms_norm_batch_invariant(..., residual=...)``) is absent.

The copied files' sha256 are printed and written to ``OUT_DIR/SHIM.json`` with the wheel's, so a
report can name exactly which bytes ran.  ``OUT_DIR`` goes on ``PYTHONPATH``.  Exit status 2 when
the wheel lacks a file or a copied file imports a vllm module the shim does not provide.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

#: Files copied unchanged from the wheel.
COPIED: tuple[str, ...] = (
    "vllm/model_executor/determinism/batch_invariant.py",
    "vllm/model_executor/determinism/batch_invariant_configs.py",
    "vllm/ir/ops/layernorm.py",
)

#: The stand-ins, by path: each provides exactly what the copied files import from it.
STUBS: dict[str, str] = {
    "vllm/__init__.py": '''"""A shim of vLLM holding its batch-invariant module only (ci/vllm_shim.py)."""

__version__ = "{version}+batchinv-shim"
''',
    "vllm/envs.py": '''"""Stand-in for vllm.envs: the one variable the batch-invariant module reads."""

import os


def __getattr__(name):
    if name == "VLLM_BATCH_INVARIANT":
        return bool(int(os.getenv("VLLM_BATCH_INVARIANT", "0")))
    raise AttributeError(f"the vllm shim's envs has no {name}")
''',
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/determinism/__init__.py": "",
    "vllm/platforms/__init__.py": '''"""Stand-in for vllm.platforms: ``current_platform`` is CUDA when torch sees a GPU, else CPU
(ROCm and XPU never reported)."""

import torch

from vllm.platforms.interface import DeviceCapability


class _Platform:
    @property
    def dispatch_key(self):
        return "CUDA" if self.is_cuda() else "CPU"

    def is_cuda(self):
        return torch.cuda.is_available()

    def is_cuda_alike(self):
        return self.is_cuda()

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def get_device_capability(self, device_id=0):
        if not self.is_cuda():
            return None
        major, minor = torch.cuda.get_device_capability(device_id)
        return DeviceCapability(major, minor)

    def is_device_capability_family(self, capability, device_id=0):
        found = self.get_device_capability(device_id)
        return found is not None and found.to_int() // 10 == capability // 10

    def num_compute_units(self, device_id=0):
        if self.is_cuda():
            index = torch.cuda.current_device() if device_id is None else device_id
            return torch.cuda.get_device_properties(index).multi_processor_count
        return torch.get_num_threads()


current_platform = _Platform()
''',
    "vllm/platforms/interface.py": '''"""Stand-in for vllm.platforms.interface: DeviceCapability."""

from typing import NamedTuple


class DeviceCapability(NamedTuple):
    major: int
    minor: int

    def as_version_str(self):
        return f"{self.major}.{self.minor}"

    def to_int(self):
        return self.major * 10 + self.minor
''',
    "vllm/triton_utils/__init__.py": '''"""Stand-in for vllm.triton_utils: the real triton (TRITON_INTERPRET=1 runs it on a CPU)."""

import triton
import triton.language as tl

__all__ = ["tl", "triton"]
''',
    "vllm/utils/__init__.py": "",
    "vllm/utils/mem_utils.py": '''"""Stand-in for vllm.utils.mem_utils."""

import torch


def get_max_shared_memory_bytes(gpu=0):
    """The opt-in shared memory per block of ``gpu`` (what vLLM asks its C extension for)."""
    return int(torch.cuda.get_device_properties(gpu).shared_memory_per_block_optin)
''',
    "vllm/utils/nccl.py": '''"""Stand-in for vllm.utils.nccl."""

import os


def pin_nccl_env(values):
    os.environ.update({k: str(v) for k, v in values.items()})
''',
    "vllm/utils/platform_utils.py": '''"""Stand-in for vllm.utils.platform_utils."""

from vllm.platforms import current_platform


def num_compute_units(device_id=0):
    return current_platform.num_compute_units(device_id)
''',
    "vllm/utils/torch_utils.py": '''"""Stand-in for vllm.utils.torch_utils."""

import torch
from packaging.version import Version


def is_torch_equal_or_newer(target):
    return Version(Version(torch.__version__).base_version) >= Version(target)
''',
    "vllm/ir/__init__.py": '''"""Stand-in for vllm.ir: its ops, without the op registry's dispatch."""

from vllm.ir import ops

__all__ = ["ops"]
''',
    "vllm/ir/op.py": '''"""Stand-in for vllm.ir.op: ``register_op`` returns the native implementation itself (no
provider selection, no torch.library registration); the tolerance and input-generator hooks are
no-ops."""


class _Op:
    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def register_input_generator(self, fn):
        return fn

    def override_tolerance(self, *args, **kwargs):
        return None


def register_op(fn=None, **options):
    if fn is None:
        return lambda f: _Op(f)
    return _Op(fn)
''',
    "vllm/ir/ops/__init__.py": '''"""Stand-in for vllm.ir.ops: the layernorm ops only."""

from .layernorm import fused_add_rms_norm, rms_norm

__all__ = ["rms_norm", "fused_add_rms_norm"]
''',
}

_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+import|import\s+([\w.]+))", re.M)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_of(path: str) -> str:
    mod = path[: -len(".py")].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _unresolved(files: dict[str, bytes]) -> list[str]:
    """``"file: module"`` for each top-level vllm import of a copied file the shim lacks (an
    import inside a function, ``vllm._custom_ops``, is allowed: it runs only on that path)."""
    provided = {_module_of(p) for p in files}
    missing = []
    for path in COPIED:
        package = _module_of(path).rsplit(".", 1)[0]
        for line in files[path].decode().splitlines():
            if line[:1].isspace():
                continue  # inside a function or a parenthesised import's names
            m = _IMPORT.match(line)
            if not m:
                continue
            name = m.group(1) or m.group(2)
            if name.startswith("."):  # relative: one dot is the package, each more its parent
                dots = len(name) - len(name.lstrip("."))
                base = package.split(".")[: len(package.split(".")) - (dots - 1)]
                name = ".".join(base + ([name.lstrip(".")] if name.strip(".") else []))
            if name.startswith("vllm") and name not in provided:
                missing.append(f"{path}: {name}")
    return missing


def build(wheel: Path, out: Path) -> dict[str, object]:
    """Write the shim under ``out`` from ``wheel``; return its manifest (also ``out/SHIM.json``).

    Raises:
        SystemExit: (status 2) the wheel lacks a copied file, or a copied file imports a vllm
            module the shim does not provide.
    """
    version = wheel.name.split("-")[1] if wheel.name.startswith("vllm-") else "unknown"
    files: dict[str, bytes] = {p: s.replace("{version}", version).encode() for p, s in STUBS.items()}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        absent = [p for p in COPIED if p not in names]
        if absent:
            raise SystemExit(f"vllm_shim: {wheel.name} has no {', '.join(absent)}")
        for p in COPIED:
            files[p] = z.read(p)
        license_names = sorted(n for n in names if n.endswith("/LICENSE") and ".dist-info/" in n)
        if license_names:
            files["vllm/LICENSE"] = z.read(license_names[0])
    missing = _unresolved(files)
    if missing:
        raise SystemExit("vllm_shim: the copied files import modules the shim lacks: " + "; ".join(missing))
    for path, data in files.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    manifest = {
        "wheel": wheel.name,
        "wheel_sha256": _sha256(wheel.read_bytes()),
        "vllm_version": version,
        "copied": {p: _sha256(files[p]) for p in COPIED},
        "stubs": sorted(STUBS),
    }
    (out / "SHIM.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    manifest = build(Path(argv[0]), Path(argv[1]))
    print(f"vllm_shim: {argv[1]} from {manifest['wheel']} (sha256 {manifest['wheel_sha256']})")
    for path, digest in manifest["copied"].items():  # type: ignore[union-attr]
        print(f"  {path}  sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
