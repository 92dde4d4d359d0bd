"""Subjects from outside: a throwaway package, pip-installed, whose kernels the harness sweeps.

The package (built in a temp dir, installed with pip into a private target directory that the
tests put on the path: the venv itself is never changed, so parallel workers never see it)
declares four rms_norm subjects and one matmul subject, in the entry-point group
``batchinv.subjects`` and as plain import paths:

* ``invariant``: a row-local fp64 RMSNorm -- passes agreement and every invariance check;
* ``varies``: sums squares in fp64 up to 16 rows and in fp32 above -- batch_prefix detects it;
* ``tf32`` (matmul): rounds fp32 operands to TF32 -- fails agreement, and the message says the
  error is TF32-sized;
* ``crashes``: raises -- an error, never a pass or a detection;
* ``foreign``: RMSNorm with another signature (3-D input, ``(inp, w, epsilon)``), adapted by a
  declared :class:`Adapter` -- passes; without the adapter, a usage error naming the
  component's parameters.

Each is driven through the CLI (``batchinv sweep --subject``, ``--as baseline``, entry points,
``batchinv list``, ``batchinv repro``) and the Python API (``check_subject``, the pytest helpers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from batchinv.harness.checks import BaselineCrashed
from batchinv.harness.subjects import ENTRY_POINT_GROUP, SubjectError, entry_point_subjects

pytestmark = [pytest.mark.cpu, pytest.mark.xdist_group("external_subjects")]

PACKAGE = "batchinv_throwaway_subjects"

MODULE = '''
import torch

from batchinv.harness.subjects import Adapter, declare


def invariant(x, weight, eps=1e-6):
    """Row-local RMSNorm in fp64, rounded once."""
    x64 = x.double()
    rstd = torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps)
    return (x64 * rstd * weight.double()).to(x.dtype)


def varies(x, weight, eps=1e-6):
    """Sums squares in fp64 up to 16 rows, in fp32 above: batch-variant."""
    acc = torch.float64 if x.shape[0] <= 16 else torch.float32
    xa = x.to(acc)
    rstd = torch.rsqrt((xa * xa).mean(-1, keepdim=True) + eps).double()
    return (x.double() * rstd * weight.double()).to(x.dtype)


def crashes(x, weight, eps=1e-6):
    raise RuntimeError("planted crash in a user kernel")


def _round_tf32(t):
    bits = t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return torch.where(torch.isfinite(t), bits.view(torch.float32).view(t.shape), t)


def tf32(x, weight, bias=None, *, layout="linear", out_dtype=None):
    """A matmul that silently rounds fp32 operands to TF32 (products exact, fp64 sums)."""
    if x.dtype == torch.float32:
        x, weight = _round_tf32(x), _round_tf32(weight)
    w = weight.double().t() if layout == "linear" else weight.double()
    out = x.double() @ w
    if bias is not None:
        out = out + bias.double()
    return out.to(out_dtype or x.dtype)


def foreign_rms_norm(inp, w, epsilon):
    """Another library's RMSNorm: [batch, seq, hidden] input, its own names, returns (out, rstd)."""
    x64 = inp.double()
    rstd = torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + epsilon)
    return (x64 * rstd * w.double()).to(inp.dtype), rstd


foreign = declare(
    foreign_rms_norm,
    adapter=Adapter(
        inputs=lambda x, weight, eps: {"inp": x[None], "w": weight, "epsilon": eps},
        output=lambda result: result[0][0],
    ),
)
'''

PYPROJECT = f'''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{PACKAGE}"
version = "0.0.1"

[tool.setuptools]
packages = ["{PACKAGE}"]

[project.entry-points."{ENTRY_POINT_GROUP}"]
"rms_norm:invariant" = "{PACKAGE}:invariant"
"rms_norm:varies" = "{PACKAGE}:varies"
"rms_norm:foreign" = "{PACKAGE}:foreign"
"matmul:tf32" = "{PACKAGE}:tf32"
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The throwaway package, pip-installed (built as a wheel, entry points and all) into a
    private target directory."""
    root = tmp_path_factory.mktemp("throwaway")
    src = root / "src"
    (src / PACKAGE).mkdir(parents=True)
    (src / PACKAGE / "__init__.py").write_text(textwrap.dedent(MODULE))
    (src / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    target = root / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert (target / PACKAGE / "__init__.py").exists()
    return target


@pytest.fixture
def on_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The installed package importable in this process (its entry points visible)."""
    monkeypatch.syspath_prepend(str(site))
    return site


def _cli(site: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        # sweeps run every case (--profile full), as these tests' expectations were written for
        [sys.executable, "-m", "batchinv.harness.cli", *args, "--lane", "cpu"]
        + (["--profile", "full"] if args[:1] == ("sweep",) else []),
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_sweeps_an_invariant_and_a_batch_variant_subject(site, tmp_path):
    report = tmp_path / "r.jsonl"
    p = _cli(
        site,
        "sweep",
        "rms_norm",
        "--subject",
        f"mine={PACKAGE}:invariant",
        "--subject",
        f"theirs={PACKAGE}:varies",
        "--max-m",
        "64",
        "--jobs",
        "1",
        "--no-progress",
        "--report",
        str(report),
    )
    assert p.returncode == 1, p.stdout + p.stderr  # the batch-variant one fails the sweep
    checks = [r for r in _records(report) if r["kind"] == "check"]
    assert {r["subject"] for r in checks} == {"mine", "theirs"}  # only the named subjects
    mine = [r for r in checks if r["subject"] == "mine"]
    assert mine and all(r["status"] in ("pass", "skip") for r in mine)
    assert {r["check"] for r in mine if r["status"] == "pass"} >= {"agreement", "batch_prefix", "row_start"}
    assert all(r["subject_target"] == f"{PACKAGE}:invariant" for r in mine)
    bad = [
        r
        for r in checks
        if r["subject"] == "theirs" and r["check"] == "batch_prefix" and r["status"] == "fail"
    ]
    assert bad and "M=1" in bad[0]["where"]
    repro = bad[0]["repro"]
    assert f"--subject theirs={PACKAGE}:varies" in repro and "--check batch_prefix" in repro
    # the repro line re-imports the subject and finds the same variance
    argv = repro.split(" ", 1)[1]
    rerun = subprocess.run(
        [sys.executable, "-m", "batchinv.harness.cli", *__import__("shlex").split(argv)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=300,
    )
    assert rerun.returncode == 1 and "FAIL" in rerun.stdout, rerun.stdout + rerun.stderr
    assert "theirs" in p.stdout and f"{PACKAGE}:varies" in p.stdout


def test_cli_as_baseline_detects_the_variant_and_fails_on_an_invariant_one(site, tmp_path):
    p = _cli(
        site,
        "sweep",
        "rms_norm",
        "--subject",
        f"theirs={PACKAGE}:varies",
        "--as",
        "baseline",
        "--max-m",
        "64",
        "--jobs",
        "1",
        "--no-progress",
        "--report",
        str(tmp_path / "a.jsonl"),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    controls = _records(tmp_path / "a.jsonl")[-1]["controls"]
    assert [(c["baseline"], c["verdict"]) for c in controls] == [("theirs", "detected")]
    assert "--as baseline" in controls[0]["repro"]
    # an invariant subject run as a negative control must vary: inconclusive fails the sweep
    # (the whole M sweep: under --max-m the verdict would be "not reached")
    p = _cli(
        site,
        "sweep",
        "rms_norm",
        "--subject",
        f"mine={PACKAGE}:invariant",
        "--as",
        "baseline",
        "--jobs",
        "1",
        "--no-progress",
        "--report",
        str(tmp_path / "b.jsonl"),
    )
    assert p.returncode == 1
    controls = _records(tmp_path / "b.jsonl")[-1]["controls"]
    assert controls[0]["verdict"] == "inconclusive" and controls[0]["is_failure"]


def test_cli_a_crashing_subject_is_an_error_as_fast_and_as_baseline(site, tmp_path):
    for role in ("fast", "baseline"):
        report = tmp_path / f"{role}.jsonl"
        p = _cli(
            site,
            "sweep",
            "rms_norm",
            "--subject",
            f"boom={PACKAGE}:crashes",
            "--as",
            role,
            "--max-m",
            "16",
            "--jobs",
            "1",
            "--no-progress",
            "--report",
            str(report),
        )
        assert p.returncode == 1, p.stdout + p.stderr
        records = _records(report)
        checks = [r for r in records if r["kind"] == "check"]
        assert checks and all(r["status"] in ("error", "skip") for r in checks)
        assert not any(r["status"] in ("pass", "fail") for r in checks)
        assert any("planted crash in a user kernel" in r["detail"] for r in checks)
        if role == "baseline":
            assert records[-1]["controls"][0]["verdict"] == "error"


def test_cli_tf32_subject_fails_agreement_with_a_tf32_message(site, tmp_path):
    report = tmp_path / "m.jsonl"
    p = _cli(
        site,
        "sweep",
        "matmul",
        "--subject",
        f"tf32={PACKAGE}:tf32",
        "--max-m",
        "8",
        "--jobs",
        "1",
        "--no-progress",
        "--report",
        str(report),
    )
    assert p.returncode == 1, p.stdout + p.stderr
    agreement = [r for r in _records(report) if r["kind"] == "check" and r["check"] == "agreement"]
    by_dtype = {}
    for r in agreement:
        by_dtype.setdefault(r["axes"]["dtype"], []).append(r)
    # every fp32 case fails, each with the TF32 diagnosis; the 16-bit cases (no TF32) pass
    assert by_dtype["fp32"] and all(r["status"] == "fail" for r in by_dtype["fp32"])
    assert all("the error is TF32-sized" in r["detail"] for r in by_dtype["fp32"])
    assert all(r["status"] == "pass" for d in ("bf16", "fp16") for r in by_dtype[d])
    assert "TF32-sized" in p.stdout


def test_entry_points_are_listed_and_swept(site, tmp_path):
    p = _cli(site, "list", "rms_norm", "matmul")
    assert p.returncode == 0, p.stderr
    for name in ("invariant", "varies", "foreign", "tf32"):
        assert name in p.stdout
    assert f"{PACKAGE}:varies" in p.stdout and ENTRY_POINT_GROUP in p.stdout
    # a sweep of rms_norm includes its entry-point subjects beside the fast kernel; one by
    # name with --subject runs it alone
    report = tmp_path / "e.jsonl"
    p = _cli(
        site,
        "sweep",
        "rms_norm",
        "--subject",
        "foreign",
        "--max-m",
        "32",
        "--jobs",
        "1",
        "--no-progress",
        "--report",
        str(report),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    checks = [r for r in _records(report) if r["kind"] == "check"]
    assert {r["subject"] for r in checks} == {"foreign"}
    assert any(r["status"] == "pass" and r["check"] == "agreement" for r in checks)
    assert all(r["status"] in ("pass", "skip") for r in checks)


def test_plain_sweep_includes_entry_point_subjects_unless_told_not_to(on_path):
    from batchinv.harness.lanes import Lane
    from batchinv.harness.registry import get
    from batchinv.harness.sweep import plan

    found = {e.subject.name: e for e in entry_point_subjects(["rms_norm"])}
    assert set(found) == {"invariant", "varies", "foreign"}
    assert found["varies"].subject.target == f"{PACKAGE}:varies"
    comp = get("rms_norm")
    tasks = plan([comp], Lane.CPU, subjects={"rms_norm": [found["varies"].subject]})
    names = {t.subject if isinstance(t.subject, str) else t.subject.name for t in tasks}
    assert {"fast", "varies"} <= names
    import argparse

    from batchinv.harness.cli import _outside_subjects

    args = argparse.Namespace(subject=[], no_entry_points=False, as_role=None)
    _, subjects = _outside_subjects(args, ["rms_norm"])
    assert {s.name for s in subjects["rms_norm"]} == {"invariant", "varies", "foreign"}
    args.no_entry_points = True
    assert _outside_subjects(args, ["rms_norm"])[1] == {}


def test_a_mismatched_signature_is_a_usage_error_naming_the_parameters(site):
    p = _cli(site, "sweep", "rms_norm", "--subject", f"raw={PACKAGE}:foreign_rms_norm", "--no-progress")
    assert p.returncode == 2
    assert "rms_norm's arguments (x, weight, eps=1e-06, dim=-1)" in p.stderr
    assert "'inp'" in p.stderr and "Adapter" in p.stderr
    p = _cli(site, "sweep", "rms_norm", "--subject", f"gone={PACKAGE}:nope", "--no-progress")
    assert p.returncode == 2 and "nope" in p.stderr
    p = _cli(site, "sweep", "rms_norm", "--subject", "unknown_entry_point", "--no-progress")
    assert p.returncode == 2 and "invariant" in p.stderr


# --- the Python API ---------------------------------------------------------------------------


def test_check_subject_judges_each_kind(on_path):
    import batchinv_throwaway_subjects as mod

    from batchinv.harness import check_subject

    good = check_subject("rms_norm", mod.invariant, lane="cpu", m_limit=64)
    assert good.ok, good.summary()
    assert good.subject.target == f"{PACKAGE}:invariant"  # importable: repro lines re-import it
    bad = check_subject("rms_norm", mod.varies, lane="cpu", m_limit=64)
    assert not bad.ok and any(r.check == "batch_prefix" for r in bad.failures)
    crash = check_subject("rms_norm", mod.crashes, lane="cpu", m_limit=16)
    assert not crash.ok and crash.errors and not any(r.status == "pass" for r in crash)
    foreign = check_subject("rms_norm", mod.foreign, lane="cpu", m_limit=32)
    assert foreign.ok, foreign.summary()
    tf32 = check_subject("matmul", mod.tf32, lane="cpu", checks=["agreement"])
    fp32 = [r for r in tf32 if r.axes["dtype"] == "fp32"]
    assert fp32 and all(r.status == "fail" and "TF32-sized" in r.detail for r in fp32)
    control = check_subject("rms_norm", mod.varies, lane="cpu", role="baseline", m_limit=64)
    assert control.ok and control.results[-1].status == "fail"
    with pytest.raises(SubjectError, match=r"rms_norm's arguments \(x, weight, eps=1e-06, dim=-1\).*'inp'"):
        check_subject("rms_norm", mod.foreign_rms_norm, lane="cpu")


def test_pytest_helpers(on_path):
    import batchinv_throwaway_subjects as mod

    from batchinv.harness import testing

    points = testing.points("rms_norm", lane="cpu", checks=["agreement", "batch_prefix"], m_limit=32)
    assert points and {p.check for p in points} == {"agreement", "batch_prefix"}
    assert len({p.id for p in points}) == len(points)
    passed = skipped = 0
    for point in points:
        try:
            assert testing.assert_subject(point, mod.invariant).status == "pass"
            passed += 1
        except pytest.skip.Exception:  # a 1-row case has no batch prefix to compare
            skipped += 1
    assert passed >= len(points) - 1 and skipped <= 1
    prefix = next(p for p in points if p.check == "batch_prefix")
    with pytest.raises(pytest.fail.Exception, match="repro: batchinv repro rms_norm"):
        testing.assert_subject(prefix, mod.varies)
    with pytest.raises(pytest.fail.Exception, match="planted crash"):
        testing.assert_subject(points[0], mod.crashes)
    assert testing.assert_varies("rms_norm", mod.varies, lane="cpu", m_limit=32).status == "fail"
    with pytest.raises(AssertionError, match="inconclusive"):
        testing.assert_varies("rms_norm", mod.invariant, lane="cpu", m_limit=32)
    with pytest.raises(BaselineCrashed):
        testing.assert_varies("rms_norm", mod.crashes, lane="cpu", m_limit=16)


def test_a_users_pytest_file_runs_with_the_helpers(site, tmp_path):
    (tmp_path / "test_mine.py").write_text(
        textwrap.dedent(
            f"""
            from batchinv.harness import testing
            from {PACKAGE} import invariant, varies

            @testing.parametrize("rms_norm", checks=["agreement", "batch_prefix"], m_limit=32)
            def test_invariant(point):
                testing.assert_subject(point, invariant)

            @testing.parametrize("rms_norm", checks=["batch_prefix"], m_limit=32)
            def test_varies(point):
                testing.assert_subject(point, varies)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--lane",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "failed" in p.stdout and " passed" in p.stdout
    assert "test_invariant" not in "\n".join(ln for ln in p.stdout.splitlines() if ln.startswith("FAILED"))
    assert any(ln.startswith("FAILED test_mine.py::test_varies") for ln in p.stdout.splitlines())
    # the failure shows the user's test line and the check's message, not the helper's source
    # (``__tracebackhide__`` in batchinv.harness.testing)
    assert "testing.assert_subject(point, varies)" in p.stdout and "repro: batchinv repro" in p.stdout
    assert "harness/testing.py" not in p.stdout and "def assert_subject" not in p.stdout, p.stdout
