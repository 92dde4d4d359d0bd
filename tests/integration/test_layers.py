"""The layering of the source tree, read from the code's own imports (an ``ast`` walk, nothing run).

Floors, bottom to top: ``reference`` <- ``fast`` <- ``harness`` <- the top package (``api/``,
which may import anything).  A floor imports only the floors below it:

* ``reference/`` imports neither ``batchinv.fast`` nor ``batchinv.harness``;
* ``fast/`` never imports ``batchinv.harness``;
* a kernel file (``fast/kernels/*.py``, not the package's ``__init__``, which runs the version
  check) imports only ``triton``, ``triton.language`` and ``batchinv.fast.kernels.primitives``:
  a change to one component's kernel file can never move another component's bits;
* nothing below the adapters imports ``batchinv.harness.adapters`` (the optional production
  libraries stay out of ``import batchinv.harness``; the subprocess test at the end checks the
  same at run time).

Every import counts: module level and inside functions, ``from . import`` resolved, and
``importlib.import_module("...")`` with a literal name.  ``test_the_walk_has_teeth`` plants one
violation of each rule in a scratch tree and requires the walk to report it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Source folder -> the import package it installs as (pyproject's package-dir).
FLOORS: dict[str, str] = {
    "reference": "batchinv.reference",
    "fast": "batchinv.fast",
    "harness": "batchinv.harness",
    "api": "batchinv",
}
KERNEL_IMPORTS = frozenset({"__future__", "triton", "triton.language", "batchinv.fast.kernels.primitives"})

pytestmark = pytest.mark.cpu


def _module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    package = FLOORS[parts[0]].split(".")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(package + parts[1:])


def _imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(root, path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or node.level:
                # ``from pkg import name`` may name a submodule: count both spellings
                for alias in node.names:
                    yield node.lineno, f"{target}.{alias.name}"
            yield node.lineno, target
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(root: Path) -> list[str]:
    """Every import in the source floors under ``root`` that breaks a rule of the module docstring."""
    found: list[str] = []
    for floor in FLOORS:
        for path in sorted((root / floor).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            in_kernels = rel.startswith("fast/kernels/") and path.name != "__init__.py"
            in_adapters = rel.startswith("harness/adapters/")
            for line, name in _imports(root, path):
                where = f"{rel}:{line} imports {name}"
                if floor == "reference" and (
                    _within(name, "batchinv.fast") or _within(name, "batchinv.harness")
                ):
                    found.append(f"{where} (reference/ imports neither fast nor harness)")
                if floor == "fast" and _within(name, "batchinv.harness"):
                    found.append(f"{where} (fast/ never imports the harness)")
                if in_kernels and name not in KERNEL_IMPORTS and not _within(name, "triton.language"):
                    found.append(f"{where} (a kernel file imports only triton and fast.kernels.primitives)")
                if floor in ("reference", "fast", "harness") and not in_adapters:
                    if _within(name, "batchinv.harness.adapters"):
                        found.append(f"{where} (only the top package reaches the adapters)")
    return found


def test_no_upward_import_and_no_sibling_kernel_import():
    assert violations(ROOT) == []


def test_the_walk_covers_the_tree():
    # A rename of a floor would make the walk read nothing and pass: count what it reads.
    for floor in FLOORS:
        assert list((ROOT / floor).rglob("*.py")), floor
    assert len(list((ROOT / "fast" / "kernels").glob("*.py"))) > 5


@pytest.mark.parametrize(
    ("rel", "source", "rule"),
    [
        ("reference/x.py", "from batchinv.fast.matmul import matmul\n", "reference/ imports neither"),
        ("reference/x.py", "def f():\n    import batchinv.harness.registry\n", "reference/ imports neither"),
        ("fast/x.py", "from batchinv.harness import subjects\n", "fast/ never imports the harness"),
        (
            "fast/baselines/x.py",
            "from ...harness.subjects import Adapter\n",
            "fast/ never imports the harness",
        ),
        (
            "fast/kernels/x.py",
            "from batchinv.fast.kernels.softmax import round_to\n",
            "a kernel file imports only",
        ),
        ("fast/kernels/x.py", "from . import softmax\n", "a kernel file imports only"),
        ("fast/kernels/x.py", "import torch\n", "a kernel file imports only"),
        (
            "harness/x.py",
            "import importlib\nimportlib.import_module('batchinv.harness.adapters.vllm')\n",
            "adapters",
        ),
    ],
)
def test_the_walk_has_teeth(tmp_path, rel, source, rule):
    for floor in FLOORS:
        (tmp_path / floor).mkdir()
    (tmp_path / "fast" / "kernels").mkdir()
    (tmp_path / "fast" / "baselines").mkdir()
    (tmp_path / "fast" / "kernels" / "ok.py").write_text(
        "import triton\nimport triton.language as tl\nfrom batchinv.fast.kernels.primitives import NEG_INF\n"
    )
    (tmp_path / rel).write_text(source)
    found = violations(tmp_path)
    assert len(found) >= 1 and all(rule in f for f in found), found


def test_harness_import_never_pulls_vllm_or_flashinfer(tmp_path):
    # Run outside the checkout, so only what is installed is importable.
    code = (
        "import sys, batchinv.harness, batchinv.harness.registry, batchinv.harness.sweep, batchinv.harness.cli;"
        "from batchinv.harness.registry import components; components();"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'flashinfer')"
        " or m.startswith('batchinv.harness.adapters'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
