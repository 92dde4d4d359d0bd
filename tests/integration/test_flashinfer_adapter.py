"""The FlashInfer adapter (``batchinv.harness.adapters.flashinfer``): FP8 ``bmm_fp8`` as subjects of
``fp8_gemm``.

Without FlashInfer (this project's venv, CI) the adapter refuses to import with the install
command, and ``import batchinv.harness`` imports neither FlashInfer nor the adapter even where a
(fake) FlashInfer is importable.  The argument mapping runs against a fake ``flashinfer`` that
computes like FlashInfer's cuBLAS path (it reads raw pointers: ``A`` as row-major
``[b, m, k]``, ``B``'s memory as ``[b, n, k]``), so a layout the adapter got wrong gives wrong
numbers against the reference; the fake also records the backend and the tuning calls.  The GPU
test (skipped without CUDA and the real FlashInfer) runs the seed's table for one shape
(``ci/flashinfer_table.py``, which ``ci/device_flashinfer.sh`` runs in full).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import pathlib
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from lane_env import needs_cpu_lane_child

from batchinv.harness.subjects import Subject, Unsupported, bound_call
from batchinv.reference.fp8_gemm import fp8_gemm as reference_fp8_gemm

ADAPTER = "batchinv.harness.adapters.flashinfer"
ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = ("cutlass", "cutlass_autotuned", "cublas", "cublas_autotuned", "cudnn", "cudnn_autotuned", "auto",
         "auto_autotuned")  # fmt: skip


class FakeBackendSupportedError(Exception):
    """Stands for ``flashinfer.utils.BackendSupportedError``."""


class FakeFlashInfer:
    """``bmm_fp8``, ``autotune`` and the tuner singleton, recording every call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.tuning = False
        self.clears = 0
        self.refuse: dict[str, str] = {}

    def bmm_fp8(self, A, B, A_scale, B_scale, dtype, out=None, backend="cublas"):
        if backend in self.refuse:
            raise FakeBackendSupportedError(self.refuse[backend])
        b, m, k = A.shape
        n = B.shape[2]
        self.calls.append(
            {
                "A": (tuple(A.shape), A.stride(), A.data_ptr()),
                "B": (tuple(B.shape), B.stride(), B.data_ptr()),
                "scales": (tuple(A_scale.shape), tuple(B_scale.shape)),
                "dtype": dtype,
                "backend": backend,
                "tuning": self.tuning,
            }
        )
        # What the cuBLAS path reads: the raw memory of A as [b, m, k] and of B as [b, n, k].
        a = torch.as_strided(A, (b, m, k), (m * k, k, 1)).float() * A_scale.float().reshape(())
        w = torch.as_strided(B, (b, n, k), (n * k, k, 1)).float() * B_scale.float().reshape(())
        return torch.bmm(a, w.transpose(1, 2)).to(dtype)

    @contextlib.contextmanager
    def autotune(self, tune_mode: bool = True) -> Iterator[None]:
        self.tuning = tune_mode
        try:
            yield
        finally:
            self.tuning = False

    def clear_cache(self) -> None:
        self.clears += 1


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=name == "flashinfer")
    vars(mod).update(attrs)
    return mod


@pytest.fixture
def fia(monkeypatch):
    """The adapter imported afresh over a fake ``flashinfer`` (the real one, if any, shadowed)."""
    fake = FakeFlashInfer()
    monkeypatch.setitem(
        sys.modules,
        "flashinfer",
        _module("flashinfer", bmm_fp8=fake.bmm_fp8, __version__="0.0+fake", __path__=[]),
    )
    monkeypatch.setitem(
        sys.modules,
        "flashinfer.autotuner",
        _module(
            "flashinfer.autotuner", autotune=fake.autotune, AutoTuner=types.SimpleNamespace(get=lambda: fake)
        ),
    )
    monkeypatch.setitem(
        sys.modules,
        "flashinfer.utils",
        _module("flashinfer.utils", BackendSupportedError=FakeBackendSupportedError),
    )
    import batchinv.harness.adapters as adapters

    saved = sys.modules.pop(ADAPTER, None)
    module = importlib.import_module(ADAPTER)
    check_device = module._check_device
    monkeypatch.setattr(module, "_check_device", lambda t: None)  # the fake runs on the CPU
    try:
        yield module, fake, check_device
    finally:
        sys.modules.pop(ADAPTER, None)
        vars(adapters).pop("flashinfer", None)
        if saved is not None:
            sys.modules[ADAPTER] = saved


def _case(m: int = 5, n: int = 24, k: int = 40, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 8).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 8).to(torch.float8_e4m3fn)
    return {"x": x, "weight": w, "x_scale": torch.tensor(0.25), "weight_scale": torch.tensor([0.125])}


def _call(module: types.ModuleType, name: str):
    declared = getattr(module, name)
    component = types.SimpleNamespace(fast=reference_fp8_gemm)
    return bound_call(component, Subject(name, fn=declared.fn, role=declared.role, adapter=declared.adapter))


# --- without FlashInfer ------------------------------------------------------------------------------


def test_adapter_import_without_flashinfer_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a)
    )
    saved = sys.modules.pop(ADAPTER, None)
    try:
        with pytest.raises(ImportError, match="needs FlashInfer: pip install flashinfer-python") as info:
            importlib.import_module(ADAPTER)
        assert type(info.value).__name__ == "FlashInferUnavailable"
    finally:
        sys.modules.pop(ADAPTER, None)
        if saved is not None:
            sys.modules[ADAPTER] = saved


FAKE_PACKAGE = {
    "__init__.py": "__version__ = '0.0+fake'\ndef bmm_fp8(*a, **k):\n    raise RuntimeError('fake')\n",
    "autotuner.py": "import contextlib\nautotune = contextlib.nullcontext\nclass AutoTuner:\n"
    "    @staticmethod\n    def get():\n        return None\n",
    "utils.py": "class BackendSupportedError(Exception):\n    pass\n",
}

HARNESS_PROBE = """
import sys, batchinv.harness, batchinv.harness.registry, batchinv.harness.sweep, batchinv.harness.cli
from batchinv.harness.registry import components; components()
bad = sorted(m for m in sys.modules if m.split('.')[0] == 'flashinfer' or m.endswith('adapters.flashinfer'))
from batchinv.harness.adapters import flashinfer as adapter  # the probe's negative control: it sees this
lazy = 'flashinfer' not in sys.modules
adapter.load()
print(bad, lazy, 'flashinfer' in sys.modules)
"""


@needs_cpu_lane_child
def test_harness_import_never_imports_flashinfer_or_the_adapter(tmp_path):
    package = tmp_path / "site" / "flashinfer"
    package.mkdir(parents=True)
    for name, text in FAKE_PACKAGE.items():
        (package / name).write_text(text)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Nothing imported by the harness; importing the adapter does not import FlashInfer; load() does.
    assert proc.stdout.split() == ["[]", "True", "True"], proc.stdout


# --- the argument mapping, against the fake ------------------------------------------------------------


def test_subjects_roles_and_component(fia):
    module, _, _ = fia
    assert {name for _, name, _ in module.SUBJECTS} == set(NAMES)
    for name in NAMES:
        declared = getattr(module, name)
        assert declared.component == "fp8_gemm"
        assert declared.role == ("baseline" if name == "auto_autotuned" else "fast"), name


@pytest.mark.parametrize("name", NAMES)
def test_mapping_matches_the_reference_and_flashinfers_layout(fia, name):
    module, fake, _ = fia
    case = _case()
    got = _call(module, name)(**case)
    want = reference_fp8_gemm(**case)
    assert got.shape == (5, 24) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=1e-6)
    run = fake.calls[-1]
    assert not run["tuning"]
    assert run["backend"] == name.removesuffix("_autotuned")
    assert run["A"] == ((1, 5, 40), (200, 40, 1), case["x"].data_ptr())
    assert run["B"] == ((1, 40, 24), (960, 1, 40), case["weight"].data_ptr())  # column-major, no copy
    assert run["scales"] == ((1,), (1,)) and run["dtype"] is torch.bfloat16


def test_strided_operands_reach_flashinfer_contiguous(fia):
    module, fake, _ = fia
    case = _case(k=80)
    strided = {**case, "x": case["x"][:, ::2], "weight": case["weight"][:, ::2]}  # K = 40, stride 2
    got = _call(module, "cublas")(**strided)
    torch.testing.assert_close(got.double(), reference_fp8_gemm(**strided), rtol=2**-7, atol=1e-6)
    assert fake.calls[-1]["A"][1] == (200, 40, 1) and fake.calls[-1]["B"][1] == (960, 1, 40)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"scale_layout": "token", "x_scale": torch.ones(5, 1), "weight_scale": torch.ones(24, 1)},
            "per-tensor",
        ),
        (
            {"scale_layout": "block", "x_scale": torch.ones(5, 1), "weight_scale": torch.ones(1, 1)},
            "per-tensor",
        ),
        ({"bias": torch.zeros(24, dtype=torch.bfloat16)}, "no bias"),
        ({"out_dtype": torch.float32}, "bf16 or fp16"),
    ],
)
def test_cases_bmm_fp8_cannot_express_are_unsupported(fia, change, match):
    module, fake, _ = fia
    with pytest.raises(Unsupported, match=match):
        _call(module, "cutlass")(**{**_case(), **change})
    assert fake.calls == []


def test_a_cpu_tensor_is_unsupported(fia):
    _, _, check_device = fia
    with pytest.raises(Unsupported, match="CUDA devices; this case is on cpu"):
        check_device(torch.zeros(1))


def test_a_backend_flashinfer_refuses_is_unsupported_with_its_text(fia):
    module, fake, _ = fia
    fake.refuse["cutlass"] = "bmm_fp8 does not support backend 'cutlass' with capability 90"
    for name in ("cutlass", "cutlass_autotuned"):
        with pytest.raises(
            Unsupported, match=r"FlashInfer 0\.0\+fake on cpu: bmm_fp8 does not support backend 'cutlass'"
        ):
            _call(module, name)(**_case())
    assert _call(module, "cublas")(**_case()).shape == (5, 24)


def test_autotuned_subject_tunes_once_per_weight_at_tune_m_then_runs_untuned(fia):
    module, fake, _ = fia
    call = _call(module, "auto_autotuned")
    case = _case()
    for m in (5, 1, 3):
        call(**{**case, "x": case["x"][:m]})
    other = _case(n=16, seed=1)
    call(**other)
    tuned = [c for c in fake.calls if c["tuning"]]
    assert [c["A"][0] for c in tuned] == [(1, module.TUNE_M, 40), (1, module.TUNE_M, 40)]
    assert [c["B"][0] for c in tuned] == [(1, 40, 24), (1, 40, 16)]
    assert [c["A"][0][1] for c in fake.calls if not c["tuning"]] == [5, 1, 3, 5]
    assert {c["backend"] for c in fake.calls} == {"auto"}


def test_each_subject_runs_on_its_own_tuning(fia):
    module, fake, _ = fia
    case = _case()
    _call(module, "cutlass")(**case)
    _call(module, "cutlass")(**case)
    assert fake.clears == 1 and not any(c["tuning"] for c in fake.calls)  # untuned: an empty cache
    _call(module, "auto_autotuned")(**case)
    _call(module, "auto_autotuned")(**case)
    assert fake.clears == 2 and sum(c["tuning"] for c in fake.calls) == 1
    _call(module, "cublas_autotuned")(**case)  # auto's entries would be hits for cuBLAS: cleared
    assert fake.clears == 3 and sum(c["tuning"] for c in fake.calls) == 2
    _call(module, "auto_autotuned")(**case)  # tuned again from an empty cache
    assert fake.clears == 4 and sum(c["tuning"] for c in fake.calls) == 3


# --- on a GPU with FlashInfer -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None,
    reason="needs CUDA and FlashInfer (ci/device_flashinfer.sh)",
)
def test_seed_table_cutlass_rows_on_this_gpu():
    """vLLM's pin (cutlass, untuned and tuned) gives the same rows at every M on 4096x4096, or
    FlashInfer refuses cutlass FP8 bmm on this GPU (SM90) with its own error text."""
    table = _table_script()
    for name in ("cutlass", "cutlass_autotuned"):
        row = table.run_config(name, [(4096, 4096)], table.MS)
        if torch.cuda.get_device_capability()[0] < 10:
            assert str(row.get("error", "")).startswith("unsupported:") and "cutlass" in str(row["error"]), (
                row
            )
        else:
            assert "error" not in row and set(row["cells"]["4096x4096"].values()) == {0}, row


def _table_script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("flashinfer_table", ROOT / "ci" / "flashinfer_table.py")
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return table


def test_table_counts_the_rows_that_differ(fia, monkeypatch):
    """``ci/flashinfer_table.py``'s counting on the CPU against the fake: 0 where the bits do not
    depend on M; the rows of the Ms whose bits do (the fake's last bit flipped at M = 7 and
    64 only, as a backend switch per bucket would) where they do; a refused backend's text."""
    module, fake, _ = fia
    table = _table_script()
    monkeypatch.setattr(table, "DEVICE", "cpu")
    shapes, ms = [(24, 40)], (1, 7, 16, 64, 128)
    assert table.run_config("cublas", shapes, ms)["cells"] == {"24x40": dict.fromkeys(ms, 0)}
    exact = fake.bmm_fp8

    def switching(A, B, *args, **kwargs):
        out = exact(A, B, *args, **kwargs)
        return (out.view(torch.int16) ^ 1).view(out.dtype) if A.shape[1] in (7, 64) else out

    monkeypatch.setattr(sys.modules["flashinfer"], "bmm_fp8", switching)
    module._loaded.clear()
    row = table.run_config("auto_autotuned", shapes, ms)
    assert row["role"] == "baseline" and row["cells"] == {"24x40": {1: 0, 7: 7, 16: 0, 64: 64, 128: 0}}
    assert table.cell(row["cells"]["24x40"]) == "M=7: 7, M=64: 64"
    fake.refuse["cutlass"] = "bmm_fp8 does not support backend 'cutlass' with capability 90"
    assert "does not support backend 'cutlass'" in table.run_config("cutlass", shapes, ms)["error"]
