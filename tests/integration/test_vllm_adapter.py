"""The vLLM adapter (``batchinv.harness.adapters.vllm``) and its environment pins.

Without vLLM (this project's venv, CI): the environment pins leave nothing behind (round trip,
after an exception, a conflicting value replaced and restored or refused), and the adapter
module refuses to import with a clear error.  With vLLM (``ci/vllm.sh``'s venv, the tests
below ``importorskip("vllm")``): loading vLLM's kernels leaves ``os.environ``, torch's
functions and the aten dispatch table as they were (negative control: vLLM's own
``enable_batch_invariant_mode()`` changes them and the probe sees it), the kernels are judged
as subjects, and the bf16 matmul is a skip on the cpu lane.
``tests/integration/test_packaging.py`` checks that ``import batchinv.harness`` never imports vLLM; in
``ci/vllm.sh``'s venv, where vLLM is installed, that test has teeth.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest
from lane_env import needs_cpu_lane_child

from batchinv.harness.adapters.env import EnvConflict, pinned_environ
from batchinv.reference.errors import ArgumentError

KEY = "BATCHINV_TEST_PIN"
OTHER = "BATCHINV_TEST_OTHER"


@pytest.fixture
def clean_env(monkeypatch):
    for key in (KEY, OTHER):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_pin_round_trip_restores_every_variable(clean_env):
    clean_env.setenv(OTHER, "kept")
    before = dict(os.environ)
    with pinned_environ({KEY: ""}):
        assert os.environ[KEY] == ""  # an empty value is a value
        os.environ["BATCHINV_TEST_ADDED"] = "1"  # what the block (a library's import) sets
        os.environ[OTHER] = "changed"
        del os.environ["PATH"]
    assert dict(os.environ) == before


def test_pin_restores_after_an_exception(clean_env):
    before = dict(os.environ)
    with pytest.raises(RuntimeError, match="inside"):
        with pinned_environ({KEY: "pinned"}):
            os.environ[OTHER] = "x"
            raise RuntimeError("inside")
    assert dict(os.environ) == before


def test_conflicting_value_is_replaced_for_the_block_and_restored(clean_env):
    clean_env.setenv(KEY, ":4096:8")  # the public bug: setdefault kept this, the pin was a no-op
    with pinned_environ({KEY: ":16:8"}):
        assert os.environ[KEY] == ":16:8"
    assert os.environ[KEY] == ":4096:8"


def test_conflicting_value_is_refused_with_a_clear_error(clean_env):
    clean_env.setenv(KEY, "0")
    before = dict(os.environ)
    with pytest.raises(EnvConflict, match=rf"{KEY}.*unset or ''.*got '0'") as info:
        with pinned_environ({KEY: "", OTHER: "1"}, on_conflict="refuse"):
            pytest.fail("the block ran")
    assert info.value.argument == f"environment variable {KEY}"
    assert dict(os.environ) == before  # nothing was set


def test_same_value_is_no_conflict(clean_env):
    clean_env.setenv(KEY, "cpu")
    with pinned_environ({KEY: "cpu"}, on_conflict="refuse"):
        assert os.environ[KEY] == "cpu"
    assert os.environ[KEY] == "cpu"


def test_unknown_conflict_policy_is_an_argument_error():
    with pytest.raises(ArgumentError, match="on_conflict"):
        with pinned_environ({}, on_conflict="keep"):
            pass


def test_adapter_import_without_vllm_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    saved = sys.modules.pop("batchinv.harness.adapters.vllm", None)
    try:
        with pytest.raises(ImportError, match="needs vLLM: pip install vllm") as info:
            importlib.import_module("batchinv.harness.adapters.vllm")
        assert type(info.value).__name__ == "VllmUnavailable"
    finally:
        sys.modules.pop("batchinv.harness.adapters.vllm", None)
        if saved is not None:
            sys.modules["batchinv.harness.adapters.vllm"] = saved


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
@needs_cpu_lane_child  # it starts `sweep --lane cpu`: refused where the interpreter's numpy is (H200 run 30)
def test_cli_subject_without_vllm_is_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "batchinv.harness.cli", "sweep", "matmul", "--lane", "cpu", "--subject",
         "vllm=batchinv.harness.adapters.vllm:matmul"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs vLLM" in proc.stdout + proc.stderr


# --- with vLLM installed (ci/vllm.sh) --------------------------------------------------------------

#: A probe of the process state vLLM's batch-invariant mode changes, printed as JSON: the
#: environment, torch's functions, the aten dispatch entries it overrides, the mode flag.
PROBE = """
import json, os, sys, torch
OPS = ["aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::mean.dim",
       "aten::_log_softmax", "aten::_softmax", "aten::softmax", "aten::bmm"]
def state():
    return {
        "env": dict(os.environ),
        "torch": {n: repr(getattr(torch, n)) for n in ("softmax", "log_softmax", "mean", "bmm", "mm", "matmul")},
        "dispatch": {op: torch._C._dispatch_dump(op) for op in OPS},
    }
before = state()
from batchinv.harness.adapters import vllm as adapter
bi = adapter.load()
x = torch.randn(4, 32)
adapter.log_softmax(x); adapter.softmax(x); adapter.mean(x, -1, False, None)
adapter.matmul(x, torch.randn(8, 32), None, "linear"); adapter.rms_norm(x, torch.ones(32), 1e-6)
if sys.argv[1] == "enable":
    bi.enable_batch_invariant_mode()
after = state()
print(json.dumps({"mode": bool(bi._batch_invariant_MODE), "lib": bi._batch_invariant_LIB is not None,
                  "changed": {k: sorted(n for n in before[k] if before[k][n] != after[k].get(n))
                              + sorted(n for n in after[k] if n not in before[k]) for k in before}}))
"""


def _probe(mode: str) -> dict:
    pytest.importorskip("vllm")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("VLLM_TARGET_DEVICE", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_loading_and_running_vllm_kernels_leaves_the_process_as_it_was():
    found = _probe("run")
    assert found == {"mode": False, "lib": False, "changed": {"env": [], "torch": [], "dispatch": []}}


def test_probe_sees_vllm_enable_batch_invariant_mode():  # the negative control of the test above
    found = _probe("enable")
    assert found["mode"] and found["lib"]
    assert (
        "aten::mean.dim" in found["changed"]["dispatch"]
        and "aten::_log_softmax" in found["changed"]["dispatch"]
    )


def test_vllm_kernels_as_subjects_on_the_cpu_lane():
    pytest.importorskip("vllm")
    import torch

    from batchinv.harness import check_subject
    from batchinv.harness.adapters import vllm as adapter
    from batchinv.harness.registry import get
    from batchinv.harness.subjects import Subject, Unsupported, bound_call

    with warnings.catch_warnings():
        # Under the interpreter vLLM's rms_norm kernel makes numpy warn (a 1-element array made a
        # scalar; overflow in fp32 squares of the extreme rows): notes, not bits, which the sweep
        # (without this suite's warnings-as-errors) and this test compare.
        warnings.simplefilter("ignore")
        good = check_subject(
            "rms_norm", adapter.rms_norm, name="vllm", lane="cpu", checks=["batch_prefix"], m_limit=32
        )
        assert good.ok, good.summary()
        call = bound_call(
            get("matmul"), Subject("vllm", fn=adapter.matmul.fn, adapter=adapter.matmul.adapter)
        )
        x, w = torch.randn(4, 32), torch.randn(8, 32)
        assert torch.allclose(call(x=x, weight=w), x @ w.t(), rtol=1e-5, atol=1e-5)
        with pytest.raises(Unsupported, match=r"bf16.*interpreter"):
            call(x=x.bfloat16(), weight=w.bfloat16())
        with pytest.raises(Unsupported, match="input dtype"):
            call(x=x.bfloat16(), weight=w.bfloat16(), out_dtype=torch.float32)
