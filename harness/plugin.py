"""The batchinv pytest plugin (registered through the ``pytest11`` entry point).

Installed, the plugin loads in every pytest run of that environment, so it acts only when the
run **opts in**; otherwise it registers its command-line options and ini key and does nothing
else: no environment variables, no Hypothesis profile, no markers, no skips, no CUDA device, no
report header.  A run opts in with any of

* the ini key ``batchinv = true`` (``[tool.pytest.ini_options]``, ``pytest.ini``, ``tox.ini``,
  ``setup.cfg``, or ``-o batchinv=true``); this project sets it in its ``pyproject.toml``, and
  xdist workers read the same ini file;
* ``--batchinv``, ``--lane LANE``, ``--batchinv-run-slow`` or ``--batchinv-report PATH`` on the
  command line (or in ``addopts`` / ``PYTEST_ADDOPTS``).

These signals are all known before any conftest or test module is imported, which is when the
cpu lane has to be entered.  Markers are not a signal: their names (``slow``, ``gpu``, ``cpu``)
are the ones every project uses, so a marker cannot be told to be batchinv's, and without the
opt-in the plugin neither registers nor reads them (another project's ``slow`` and ``gpu`` tests
run as they would without batchinv; under ``--strict-markers`` an unregistered one still errors).
The fixtures are batchinv's own: a test that uses ``lane`` or ``device`` in a run that did not
opt in enters the lane when the fixture is first set up.  That is late, after collection
imported the test modules: on the cpu lane it fails with a ``RuntimeError`` naming the opt-in if
triton was already imported without ``TRITON_INTERPRET=1``.

In a run that opts in, the plugin

* registers the markers ``cpu``, ``gpu``, ``sm90``, ``sm100``, ``negative_control``, ``slow``,
  ``gpu_2``, ``gpu_4`` (the project runs with ``--strict-markers``);
* detects the lane from the hardware (``--lane`` forces one) and enters it before any conftest
  or test module is imported, so ``TRITON_INTERPRET=1`` is in place before triton loads on the
  cpu lane; if something imported triton before the plugin ran, the run stops with a usage error;
* stops the run with a usage error naming the version found and the tested range when the
  installed torch or Triton (or, on the cpu lane, numpy next to Triton 3.6) is outside what
  batchinv is tested with (:mod:`batchinv.fast.versions`);
* skips at collection, with a reason, every test whose lane markers exclude this lane: ``cpu``
  runs on the cpu lane; ``gpu`` on any GPU lane; ``sm90`` / ``sm100`` on that lane only.  A test
  with none of them is host-only code and runs on every lane.  ``slow`` tests run only with
  ``--batchinv-run-slow``;
* under pytest-xdist on a machine with several GPUs, gives each worker its own GPU; under
  ``torchrun`` each rank takes the GPU of its ``LOCAL_RANK``;
* skips the multi-GPU tests (``gpu_2``, ``gpu_4``) unless the run is a rank of ``torchrun`` with
  that ``WORLD_SIZE`` on a GPU lane (``ci/multi_gpu.sh``), with a reason;
* loads a Hypothesis profile: ``ci`` (derandomized, no deadline) when ``CI`` is set, ``dev``
  (random, no deadline) otherwise, ``$BATCHINV_HYPOTHESIS_PROFILE`` to choose;
  ``--hypothesis-profile`` still wins;
* prints the lane in the report header;
* records, on every registry test (the check rows it hands to :func:`record`: this project's
  ``tests/components/test_components.py`` and :mod:`batchinv.harness.testing`'s
  ``assert_subject`` / ``assert_varies``), the ``user_properties`` component, subject, check,
  case, lane, status, worst_ulp, bound_ratio, rows_differing, repro and checks (of its deciding
  row: the first that failed, crashed or timed out, else the last), so ``--junitxml`` carries
  them, under xdist too (item properties travel with each test's report; suite properties do
  not, pytest #2770 and #7767);
* with ``--batchinv-report PATH``, writes those rows as the JSON-lines report ``batchinv sweep
  --report`` writes (a header, one ``check`` row each with the test's node id in ``test``, a
  summary), for ``batchinv report PATH`` to render: each process appends to its own file in
  ``PATH.parts/`` and the controller merges them into ``PATH`` when the session ends.

Options are registered in every run, so their names must not collide with another project's
conftest (argparse refuses a second ``--run-slow``, a name many conftests add): hence
``--batchinv-run-slow``, and ``dest`` names prefixed ``batchinv``.  ``--lane`` keeps the CLI's
name; a project whose conftest adds its own ``--lane`` cannot run with batchinv installed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from batchinv.fast.versions import UnsupportedVersionError, check_versions
from batchinv.harness.lanes import Lane, detect_lane, enter_lane, parse_lane, under_torchrun

if TYPE_CHECKING:
    from batchinv.harness.checks import CheckResult

LANE_MARKERS = ("cpu", "gpu", "sm90", "sm100")
MARKERS = {
    "cpu": "runs on the cpu lane (Triton interpreter, small shapes)",
    "gpu": "runs on any GPU lane",
    "sm90": "runs on the sm90 lane (Hopper)",
    "sm100": "runs on the sm100 lane (Blackwell)",
    "negative_control": "a check run against an unpinned baseline; it must fail (strict xfail)",
    "slow": "long-running; needs --batchinv-run-slow",
    "gpu_2": "a multi-GPU test of 2 ranks: runs only under torchrun with WORLD_SIZE=2 on a GPU lane (ci/multi_gpu.sh)",
    "gpu_4": "a multi-GPU test of 4 ranks: runs only under torchrun with WORLD_SIZE=4 on a GPU lane (ci/multi_gpu.sh)",
}
#: The multi-GPU lane markers and the world size each needs.
MULTI_GPU_MARKERS = {"gpu_2": 2, "gpu_4": 4}
INI_KEY = "batchinv"
OPT_IN_HINT = "set `batchinv = true` in the pytest ini file, or pass --batchinv or --lane"

_LANE: Lane | None = None
_ENABLED = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("batchinv")
    group.addoption(
        "--batchinv",
        action="store_true",
        default=False,
        dest="batchinv",
        help="enable the batchinv plugin for this run (as the ini key `batchinv = true` does)",
    )
    group.addoption(
        "--lane",
        choices=[lane.value for lane in Lane],
        default=None,
        dest="batchinv_lane",
        help="force a batchinv lane (default: detect); enables the plugin",
    )
    group.addoption(
        "--batchinv-run-slow",
        action="store_true",
        default=False,
        dest="batchinv_run_slow",
        help="run tests marked slow; enables the plugin",
    )
    group.addoption(
        "--batchinv-report",
        default=None,
        dest="batchinv_report",
        metavar="PATH",
        help=(
            "write the registry tests' check rows to PATH as a JSON-lines report (as `batchinv "
            "sweep --report` does; `batchinv report PATH` renders it); enables the plugin"
        ),
    )
    parser.addini(
        INI_KEY,
        type="bool",
        default=False,
        help="enable the batchinv plugin: enter the lane, skip by lane markers, Hypothesis profiles",
    )


def opted_in(config: pytest.Config) -> bool:
    """Whether this run opted in to the plugin (ini key or a batchinv option)."""
    ns = config.known_args_namespace
    return bool(
        config.getini(INI_KEY)
        or getattr(ns, "batchinv", False)
        or getattr(ns, "batchinv_lane", None)
        or getattr(ns, "batchinv_run_slow", False)
        or getattr(ns, "batchinv_report", None)
    )


def _enabled(config: pytest.Config) -> bool:
    return config.stash.get(_ENABLED, False)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    global _LANE
    _LANE = None
    enabled = opted_in(early_config)
    early_config.stash[_ENABLED] = enabled
    if not enabled:
        return
    forced = early_config.known_args_namespace.batchinv_lane
    _LANE = parse_lane(forced) if forced else detect_lane()
    try:
        enter_lane(_LANE)
    except RuntimeError as exc:
        raise pytest.UsageError(
            f"batchinv: {exc} (by a plugin or sitecustomize loaded before batchinv); "
            "set TRITON_INTERPRET=1 in the environment"
        ) from None
    try:
        check_versions(interpreter=_LANE is Lane.CPU)
    except UnsupportedVersionError as exc:
        raise pytest.UsageError(f"batchinv: {exc}") from None


def current_lane() -> Lane:
    """The lane this pytest session runs on."""
    return _LANE if _LANE is not None else detect_lane()


def _enter_late() -> Lane:
    """Enter the lane for a fixture used in a run that did not opt in."""
    global _LANE
    if _LANE is None:
        lane = detect_lane()
        try:
            enter_lane(lane)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}.  batchinv is not enabled for this run, so the lane was entered only when "
                "a test first used its `lane` or `device` fixture, after the test modules were "
                f"imported.  To enter it before anything imports triton, {OPT_IN_HINT}."
            ) from None
        _LANE = lane
    return _LANE


def pytest_configure(config: pytest.Config) -> None:
    if not _enabled(config):
        return
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    _start_report(config)
    _hypothesis_profiles()
    lane = current_lane()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        import torch

        # Each worker takes its share of the cores: N workers each running torch's default
        # (one thread per core) oversubscribe the machine N-fold while they build cases.
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers)))
        if lane.is_gpu:
            global _SHARED_GPU
            from batchinv.harness import build_cache

            count = torch.cuda.device_count()
            if count > 1:
                torch.cuda.set_device(worker_gpu(worker, count))
            per_gpu = -(-workers // max(1, count))
            build_cache.share_device(per_gpu)
            _SHARED_GPU = per_gpu > 1
    elif lane.is_gpu and under_torchrun():
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # one GPU per rank


_SHARED_GPU = False


def multi_gpu_skip_reason(markers: set[str], lane: Lane) -> str | None:
    """Why a test with the multi-GPU markers ``gpu_2`` / ``gpu_4`` does not run here (None: it
    runs): it needs a GPU lane, ``torchrun`` and that world size."""
    wanted = sorted(n for m, n in MULTI_GPU_MARKERS.items() if m in markers)
    if not wanted:
        return None
    label = "/".join(f"gpu_{n}" for n in wanted)
    if not lane.is_gpu:
        return f"{label}: a multi-GPU test; this is the cpu lane (ci/multi_gpu.sh runs it under torchrun)"
    if not under_torchrun():
        return f"{label}: a multi-GPU test; runs only under torchrun (ci/multi_gpu.sh)"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world not in wanted:
        return f"{label}: needs WORLD_SIZE in {wanted}; this torchrun has {world}"
    return None


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Workers sharing a GPU give its free cached memory back after each test (else each
    worker's allocator keeps its high-water mark and the GPU runs out)."""
    if _SHARED_GPU:
        from batchinv.harness.build_cache import release_device_memory

        release_device_memory()


# --- user_properties and the JSON-lines report of a pytest run --------------------------------

#: The user_properties a registry test records (:func:`record`), in this order.
PROPERTIES = (
    "component",
    "subject",
    "check",
    "case",
    "lane",
    "status",
    "worst_ulp",
    "bound_ratio",
    "rows_differing",
    "repro",
    "launched",
    "checks",
)
#: The ``launched`` property's length limit (the deciding row's launch provenance, one line).
LAUNCHED_CHARS = 600
_ROWS = pytest.StashKey[list[Any]]()
_CURRENT: pytest.Item | None = None


class _Report:
    """This process's share of ``--batchinv-report``: its part file, opened at its first row."""

    def __init__(self, path: Path, part: str, controller: bool) -> None:
        self.path = path
        self.parts = path.with_name(path.name + ".parts")
        self.part = self.parts / f"{part}.jsonl"
        self.controller = controller
        self.started = time.perf_counter()
        self.header: dict[str, Any] = {}
        self._fh: IO[str] | None = None

    def row(self, result: CheckResult, nodeid: str) -> None:
        from dataclasses import asdict

        from batchinv.harness import strict_json

        if self._fh is None:
            self.parts.mkdir(parents=True, exist_ok=True)
            self._fh = self.part.open("a", encoding="utf-8")
        self._fh.write(strict_json.dumps({"kind": "check", **asdict(result), "test": nodeid}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def merge(self, exitstatus: int) -> None:
        """The controller's end: header, every process's rows (by part), summary, into ``path``."""
        import json
        import shutil

        from batchinv.harness.report import JsonlReport

        self.close()
        count = 0
        with JsonlReport(self.path) as out:
            out.write("header", self.header)
            for part in sorted(self.parts.glob("*.jsonl")) if self.parts.is_dir() else []:
                for line in part.read_text(encoding="utf-8").splitlines():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:  # a worker killed mid-line
                        continue
                    out.write(row.pop("kind", "check"), row)
                    count += 1
            out.write(
                "summary",
                {
                    "ok": int(exitstatus) == 0,
                    "source": "pytest",
                    "exitstatus": int(exitstatus),
                    "rows": count,
                    "wall_seconds": time.perf_counter() - self.started,
                },
            )
        shutil.rmtree(self.parts, ignore_errors=True)


_REPORT: _Report | None = None


def _start_report(config: pytest.Config) -> None:
    """Set up ``--batchinv-report`` in this process (the controller clears stale parts and makes
    the header: the date and environment of the run's start)."""
    global _REPORT
    _REPORT = None
    value = config.getoption("batchinv_report", None)
    if not value:
        return
    path = Path(value)
    if not path.is_absolute():
        path = Path(str(config.invocation_params.dir)) / path
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    controller = not hasattr(config, "workerinput")
    _REPORT = _Report(path, worker or "main", controller)
    if controller:
        import shutil

        from batchinv.harness.report import environment

        shutil.rmtree(_REPORT.parts, ignore_errors=True)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("", encoding="utf-8")
        except OSError as exc:
            raise pytest.UsageError(f"--batchinv-report: cannot write {str(path)!r} ({exc})") from None
        _REPORT.header = {**environment(current_lane()), "source": "pytest"}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    report = _REPORT
    if report is None:
        return
    if report.controller:
        report.merge(exitstatus)
    else:
        report.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Note the running test for :func:`record` (in a run that opted in)."""
    global _CURRENT
    _CURRENT = item if _enabled(item.config) else None
    try:
        return (yield)
    finally:
        _CURRENT = None


def properties(result: CheckResult, checks: int = 1) -> list[tuple[str, Any]]:
    """The user_properties of a registry test whose deciding row is ``result`` (None: "")."""
    values = {f: getattr(result, f, None) for f in PROPERTIES}
    values["checks"] = checks
    from batchinv.harness.provenance import lines

    launched = " | ".join(lines(getattr(result, "launches", None) or []))
    values["launched"] = launched[:LAUNCHED_CHARS] + ("..." if len(launched) > LAUNCHED_CHARS else "")
    return [(name, "" if values[name] is None else values[name]) for name in PROPERTIES]


def record(*results: CheckResult) -> None:
    """Record check rows on the running registry test: its ``user_properties`` (those of
    :data:`PROPERTIES`, from the deciding row: the first that failed, crashed or timed out,
    else the last; ``checks``: the rows recorded) and, with ``--batchinv-report``, the report's
    rows.  Outside a test of a run that opted in, it does nothing."""
    item = _CURRENT
    if item is None or not results:
        return
    rows = item.stash.setdefault(_ROWS, [])
    rows.extend(results)
    deciding = next((r for r in rows if r.status in ("fail", "error", "timeout")), rows[-1])
    kept = [(k, v) for k, v in item.user_properties if k not in PROPERTIES]
    item.user_properties[:] = kept + properties(deciding, len(rows))
    if _REPORT is not None:
        for r in results:
            _REPORT.row(r, item.nodeid)


def worker_gpu(worker: str, gpu_count: int) -> int:
    """The GPU an xdist worker (``gw0``, ``gw1``...) takes: its number modulo the GPU count."""
    return int(worker.removeprefix("gw")) % gpu_count


def _hypothesis_profiles() -> None:
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # pragma: no cover - hypothesis is a dependency
        return
    common: dict[str, Any] = {
        "deadline": None,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    }
    settings.register_profile("ci", derandomize=True, print_blob=True, **common)
    settings.register_profile("dev", **common)
    settings.load_profile(
        os.environ.get("BATCHINV_HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
    )


def lane_skip_reason(markers: set[str], lane: Lane) -> str | None:
    """Why a test with these lane markers does not run on ``lane`` (None: it runs)."""
    lanes = markers & set(LANE_MARKERS)
    if not lanes:
        return None
    if lane is Lane.CPU:
        return (
            None if "cpu" in lanes else f"needs a GPU lane ({', '.join(sorted(lanes))}); this is the cpu lane"
        )
    if "gpu" in lanes or lane.value in lanes:
        return None
    return f"runs on {', '.join(sorted(lanes))}; this is the {lane.value} lane"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _enabled(config):
        return
    lane = current_lane()
    run_slow = config.getoption("batchinv_run_slow")
    for item in items:
        names = {m.name for m in item.iter_markers()}
        reason = multi_gpu_skip_reason(names, lane) or lane_skip_reason(names, lane)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif "slow" in names and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: needs --batchinv-run-slow"))


def pytest_report_header(config: pytest.Config) -> str | None:
    if not _enabled(config):
        return None
    lane = current_lane()
    text = f"batchinv lane: {lane.value}"
    if lane is Lane.CPU:
        text += f" (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')})"
    return text


@pytest.fixture(scope="session")
def lane(pytestconfig: pytest.Config) -> Lane:
    """The lane of this session (entered on first use if the run did not opt in)."""
    return current_lane() if _enabled(pytestconfig) else _enter_late()


@pytest.fixture(scope="session")
def device(lane: Lane) -> Any:
    """The torch device tests of this lane put tensors on."""
    import torch

    return torch.device("cpu" if lane is Lane.CPU else "cuda")
