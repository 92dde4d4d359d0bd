"""The version check (``batchinv.fast.versions``): an untested torch or Triton, or numpy >= 2.4
under Triton 3.6's interpreter, is refused with the version found and the range, at kernel
import, in the CLI and in the pytest plugin."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest

from batchinv.fast.versions import TORCH, TRITON, UnsupportedVersionError, check_versions

GOOD = {"torch": "2.13.0+cpu", "triton": "3.6.0", "numpy": "2.3.5"}


def _check(*, interpreter: bool = True, env: dict[str, str] | None = None, **found: str) -> None:
    installed = {**GOOD, **found}
    check_versions(interpreter=interpreter, version_of=installed.__getitem__, env=env or {})


@pytest.mark.parametrize(
    ("package", "version"),
    [
        ("torch", "2.11.0"),
        ("torch", "2.11.0a0+gitabc123"),  # an NGC-style pre-release build of 2.11
        ("torch", "2.15.2+cu130"),
        ("triton", "3.6.0+cu130"),
        ("triton", "3.7.1"),
        ("triton", "3.8.0"),
        ("triton", "3.9.0"),
    ],
)
def test_versions_in_the_tested_range_pass(package, version):
    _check(**{package: version}, numpy="2.3.5")


@pytest.mark.parametrize(
    ("package", "version", "tested"),
    [
        ("torch", "2.10.0", "torch 2.11 to 2.15"),
        ("torch", "2.16.0", "torch 2.11 to 2.15"),
        ("torch", "3.0.0", "torch 2.11 to 2.15"),
        ("triton", "3.5.1", "triton 3.6 to 3.9"),
        ("triton", "3.10.0", "triton 3.6 to 3.9"),
        ("triton", "4.0", "triton 3.6 to 3.9"),
    ],
)
def test_versions_outside_the_tested_range_raise_naming_found_and_range(package, version, tested):
    with pytest.raises(UnsupportedVersionError) as info:
        _check(**{package: version})
    err = info.value
    assert (err.package, err.found) == (package, version)
    assert tested in err.expected
    assert f"package '{package}'" in str(err)
    assert version in str(err)
    assert tested in str(err)
    assert "BATCHINV_ALLOW_UNTESTED=1" in str(err)


def test_allow_untested_lets_an_untested_release_through():
    _check(triton="3.10.0", torch="2.16.0", env={"BATCHINV_ALLOW_UNTESTED": "1"})
    with pytest.raises(UnsupportedVersionError):
        _check(triton="3.10.0", env={"BATCHINV_ALLOW_UNTESTED": "0"})


@pytest.mark.parametrize("numpy", ["2.4.0", "2.4.6", "3.0.0"])
def test_triton_36_interpreter_refuses_numpy_24(numpy):
    with pytest.raises(UnsupportedVersionError) as info:
        _check(triton="3.6.0", numpy=numpy)
    assert (info.value.package, info.value.found) == ("numpy", numpy)
    assert "numpy < 2.4 next to triton 3.6.0" in str(info.value)
    assert "install 'numpy<2.4', or triton >= 3.7" in str(info.value)
    # a known-bad pair is not "untested": the escape hatch does not let it through
    with pytest.raises(UnsupportedVersionError):
        _check(triton="3.6.0", numpy=numpy, env={"BATCHINV_ALLOW_UNTESTED": "1"})


@pytest.mark.parametrize(
    ("triton", "numpy", "interpreter"),
    [
        ("3.6.0", "2.3.5", True),  # numpy below 2.4
        ("3.6.0", "2.4.6", False),  # no interpreter: GPU lanes take any numpy
        ("3.7.1", "2.4.6", True),
        ("3.8.0", "2.4.6", True),
        ("3.9.0", "2.4.6", True),
    ],
)
def test_numpy_24_is_accepted_where_the_interpreter_takes_it(triton, numpy, interpreter):
    _check(triton=triton, numpy=numpy, interpreter=interpreter)


def test_an_unparsable_version_is_a_typed_error():
    with pytest.raises(UnsupportedVersionError, match="PEP 440"):
        _check(torch="not-a-version")


def test_ranges_match_the_pyproject_pins():
    """The runtime range and the metadata's requirement specifiers say the same thing."""
    from packaging.requirements import Requirement

    requires = {Requirement(r).name: Requirement(r) for r in importlib.metadata.requires("batchinv") or []}
    for accepted in (TORCH, TRITON):
        spec = requires[accepted.package].specifier
        lowest, highest = accepted.oldest, accepted.newest
        assert spec.contains(f"{lowest[0]}.{lowest[1]}.0")
        assert spec.contains(f"{highest[0]}.{highest[1]}.9")
        assert not spec.contains(f"{highest[0]}.{highest[1] + 1}.0")
        assert not spec.contains(f"{lowest[0]}.{lowest[1] - 1}.9")
    assert not any(s.operator in ("<", "<=") for s in requires["numpy"].specifier)


def test_this_environment_passes():
    check_versions(interpreter=os.environ.get("TRITON_INTERPRET") == "1")


def _fake_triton(monkeypatch, version: str) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda p: version if p == "triton" else real(p))


def test_importing_the_kernels_runs_the_check(monkeypatch):
    import batchinv.fast.kernels

    _fake_triton(monkeypatch, "3.10.0")
    with pytest.raises(UnsupportedVersionError, match=r"found 3\.10\.0"):
        importlib.reload(batchinv.fast.kernels)
    monkeypatch.undo()
    importlib.reload(batchinv.fast.kernels)


def test_cli_exits_3_with_the_message(monkeypatch, capsys):
    from batchinv.harness.cli import main

    _fake_triton(monkeypatch, "3.5.0")
    assert main(["list"]) == 3
    err = capsys.readouterr().err
    assert "package 'triton': expected triton 3.6 to 3.9" in err
    assert "found 3.5.0" in err


def test_plugin_stops_the_run_with_a_usage_error(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    code = textwrap.dedent(
        """
        import importlib.metadata as m, sys
        real = m.version
        m.version = lambda p: "2.16.0" if p == "torch" else real(p)
        import pytest
        sys.exit(pytest.main(["-p", "no:cacheprovider", "--lane", "cpu", "test_nothing.py"]))
        """
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")
    }
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "package 'torch': expected torch 2.11 to 2.15" in proc.stderr
    assert "found 2.16.0" in proc.stderr


def test_version_check_module_stays_light(tmp_path):
    """The check reads metadata: importing it (as the CLI does first) imports neither torch nor triton."""
    code = (
        "import sys, batchinv.fast.versions; sys.exit(int('torch' in sys.modules or 'triton' in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
