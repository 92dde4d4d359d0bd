"""Packaging: one import namespace, no bare top-level modules, a light harness import."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import pytest
from lane_env import needs_cpu_lane_child


def _run_outside_checkout(code: str, tmp_path) -> subprocess.CompletedProcess:
    """Run ``code`` with the checkout off sys.path: only what is installed is importable."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "250"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)


def test_no_bare_top_level_packages_installed(tmp_path):
    code = (
        "import importlib.util, sys;"
        "bare = [n for n in ('reference', 'fast', 'harness') if importlib.util.find_spec(n)];"
        "import batchinv.reference, batchinv.fast, batchinv.harness;"
        "print(bare); sys.exit(1 if bare else 0)"
    )
    proc = _run_outside_checkout(code, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("sub", ["reference", "fast", "harness"])
def test_source_folders_are_batchinv_subpackages(sub):
    module = importlib.import_module(f"batchinv.{sub}")
    assert module.__name__ == f"batchinv.{sub}"


def test_console_script_and_pytest_plugin_are_registered():
    eps = importlib.metadata.entry_points()
    scripts = {ep.name: ep.value for ep in eps.select(group="console_scripts")}
    assert scripts.get("batchinv") == "batchinv.harness.cli:main"
    plugins = {ep.name: ep.value for ep in eps.select(group="pytest11")}
    assert plugins.get("batchinv") == "batchinv.harness.plugin"


@needs_cpu_lane_child
@needs_cpu_lane_child
def test_cli_lists_every_registered_component():
    from batchinv.harness.registry import COMPONENT_MODULES

    proc = subprocess.run(
        [sys.executable, "-m", "batchinv.harness.cli", "list", "--lane", "cpu"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stderr
    for name in COMPONENT_MODULES:
        assert name in proc.stdout


def test_top_level_enable_is_fast_enable_and_import_stays_light(tmp_path):
    code = (
        "import sys, batchinv;"
        "light = 'triton' not in sys.modules and 'batchinv.fast.enable.aten_override' not in sys.modules;"
        "import batchinv.fast;"
        "same = batchinv.enable is batchinv.fast.enable.enable and callable(batchinv.fast.enable);"
        "print(light, same); sys.exit(0 if light and same else 1)"
    )
    proc = _run_outside_checkout(code, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_top_level_unknown_attribute_raises_attribute_error():
    import batchinv

    with pytest.raises(AttributeError, match="no attribute 'not_there'"):
        batchinv.not_there  # noqa: B018


# the flat baseline modules as they were before the house step (git ls-tree 180434f fast/)
MOVED_BASELINES = (
    "cuda_graph_buckets", "decode_attention", "decode_partition_plan", "fp8_gemm", "fp8_quant",
    "fused_moe", "grouped_gemm", "matmul", "mean", "moe_align", "moe_combine", "moe_router",
    "prefill_chunk_plan", "rms_norm", "softmax", "swiglu", "topk", "w4a16_nvfp4",
)  # fmt: skip


@needs_cpu_lane_child
def test_old_baseline_import_paths_are_the_moved_modules(tmp_path):
    """``batchinv.fast.<c>_baselines`` (the outside kit imports three) is ``fast.baselines.<c>``,
    the same module object, by ``import`` and by ``from ... import``; a name with no baselines
    module is still a ModuleNotFoundError."""
    code = f"""
import importlib
for c in {MOVED_BASELINES!r}:
    old = importlib.import_module(f"batchinv.fast.{{c}}_baselines")
    new = importlib.import_module(f"batchinv.fast.baselines.{{c}}")
    assert old is new, (c, old, new)
from batchinv.fast import decode_attention_baselines
assert decode_attention_baselines is importlib.import_module("batchinv.fast.baselines.decode_attention")
try:
    import batchinv.fast.no_such_component_baselines
except ModuleNotFoundError as e:
    print("missing ok", e.name)
"""
    proc = _run_outside_checkout(code, tmp_path)
    assert proc.returncode == 0 and "missing ok" in proc.stdout, proc.stdout + proc.stderr
