"""Fetch the wheels that FlashInfer's ``bmm_fp8`` needs on the H200 image into DEST (``.whl``).

    python3 ci/flashinfer_wheels.py .whl      # here (it needs PyPI); then carry ".whl" to the device

The device image (``/work/.library/device/KINDS.md``) has torch, numpy, ninja, nvcc, cuBLAS and
cuDNN (``nvidia-cudnn-cu13``) but not three of FlashInfer's needs for ``bmm_fp8``:

* ``flashinfer-python`` itself (py3-none-any, 59 MiB: most of it is CUDA sources for kernels
  that ``bmm_fp8`` never compiles, see :data:`KEEP_CSRC`);
* ``apache-tvm-ffi`` (``import flashinfer`` imports ``tvm_ffi``, its JIT's binding layer);
* ``nvidia-cudnn-frontend`` (``import cudnn``: without it FlashInfer's ``CUDNN_AVAILABLE`` is
  False and ``backend="auto"`` tunes over cuBLAS alone, so the seed's backend switch is gone).

The rest of its Requires-Dist is not needed by ``bmm_fp8`` on SM90, and its imports are lazy or
guarded (checked: ``import flashinfer`` and ``CUDNN_AVAILABLE`` with only these three on top of
the image's packages): ``nvidia-cutlass-dsl`` (the ``cute-dsl`` backend, SM107 only),
``cuda-tile`` (cuTile kernels), ``nccl4py`` and ``nccl-extensions`` (MoE expert parallelism),
``cuda-python`` (a meta package; the image has ``cuda-bindings``).

The device's carry limit is 64 MiB for the whole working tree, so the FlashInfer wheel is
repacked without ``flashinfer/data/csrc``'s sub-folders (the sources of attention, MoE, sampling
... kernels): ``bmm_fp8``'s JIT module (``flashinfer/jit/gemm/core.py``, ``gen_gemm_module``)
compiles ``csrc/bmm_fp8.cu``, ``csrc/group_gemm.cu`` and ``csrc/flashinfer_gemm_binding.cu``,
which include only top-level ``csrc`` headers, ``data/include`` and ``data/cutlass`` (kept).  The
repacked wheel's version carries the local label ``+bmmfp8`` so it is never taken for the
upstream one; its RECORD lists exactly the files it holds.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import pathlib
import subprocess
import sys
import tempfile
import zipfile

FLASHINFER = ("flashinfer-python", "0.7.2.post1")
DEPS = (("apache-tvm-ffi", "0.1.15.post2"), ("nvidia-cudnn-frontend", "1.32.0"))
LOCAL = "bmmfp8"
#: The sub-folders of ``flashinfer/data/csrc`` kept (``nv_internal``: TensorRT-LLM helpers that the
#: SM100 cutlass FP8 GEMM includes; small).  Every top-level file of ``csrc`` is kept.
KEEP_CSRC = ("nv_internal",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip
#: What the wheels may weigh together: the carry limit (64 MiB) less the checkout (about 15 MiB).
BUDGET_MIB = 48.0


def download(spec: str, dest: pathlib.Path) -> pathlib.Path:
    """``pip download`` one wheel for CPython 3.12 on manylinux x86-64 (the device) into dest."""
    before = set(dest.iterdir())
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest), spec]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd, check=True)
    (new,) = set(dest.iterdir()) - before
    return new


def _keep(name: str) -> bool:
    parts = name.split("/")
    if parts[:3] != ["flashinfer", "data", "csrc"] or len(parts) == 4:
        return True
    return parts[3] in KEEP_CSRC


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def slim(wheel: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """Repack ``wheel`` without the unneeded ``csrc`` folders, as version ``<version>+bmmfp8``."""
    name, version = FLASHINFER
    dist = name.replace("-", "_")
    old_info, new_info = f"{dist}-{version}.dist-info", f"{dist}-{version}+{LOCAL}.dist-info"
    out = dest / f"{dist}-{version}+{LOCAL}-py3-none-any.whl"
    rows = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if not _keep(info.filename) or info.filename == f"{old_info}/RECORD":
                continue
            data = src.read(info)
            target = info.filename.replace(old_info + "/", new_info + "/", 1)
            if target == f"{new_info}/METADATA":
                data = data.replace(
                    f"\nVersion: {version}\n".encode(), f"\nVersion: {version}+{LOCAL}\n".encode(), 1
                )
            item = zipfile.ZipInfo(target, date_time=info.date_time)
            item.external_attr = info.external_attr
            item.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(item, data)
            rows.append((target, _record_hash(data), str(len(data))))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([*rows, (f"{new_info}/RECORD", "", "")])
        dst.writestr(f"{new_info}/RECORD", buf.getvalue())
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    dest = pathlib.Path(argv[0])
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full = download("==".join(FLASHINFER), pathlib.Path(tmp))
        wheels = [slim(full, dest)]
        print(f"{full.name}: {full.stat().st_size / 2**20:.1f} MiB upstream", flush=True)
    wheels += [download(f"{n}=={v}", dest) for n, v in DEPS]
    total = 0.0
    for wheel in wheels:
        size = wheel.stat().st_size / 2**20
        total += size
        print(f"{wheel.name}: {size:.1f} MiB")
    print(f"total {total:.1f} MiB (budget {BUDGET_MIB} MiB)")
    stale = sorted(p.name for p in dest.glob("*.whl") if p not in wheels)
    if stale:
        print(
            f"also in {dest} (the device installs every *.whl there; remove them): {stale}", file=sys.stderr
        )
        return 1
    return 0 if total <= BUDGET_MIB else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
