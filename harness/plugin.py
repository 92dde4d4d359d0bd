"""The batchinv pytest plugin (registered through the ``pytest11`` entry point).

* Registers the markers ``cpu``, ``gpu``, ``sm90``, ``sm100``, ``negative_control``, ``slow``
  (the project runs with ``--strict-markers``).
* Detects the lane from the hardware (``--lane`` forces one) and enters it before any conftest
  or test module is imported, so ``TRITON_INTERPRET=1`` is in place before triton loads on the
  cpu lane.
* Skips at collection, with a reason, every test whose lane markers exclude this lane: ``cpu``
  runs on the cpu lane; ``gpu`` on any GPU lane; ``sm90`` / ``sm100`` on that lane only.  A test
  with none of them is host-only code and runs on every lane.  ``slow`` tests run only with
  ``--run-slow``.
* Under pytest-xdist on a machine with several GPUs, each worker takes its own GPU.
* Hypothesis profiles: ``ci`` (derandomized, no deadline), loaded when ``CI`` is set;
  ``dev`` (random, no deadline) otherwise; ``--hypothesis-profile`` still wins.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from batchinv.harness.lanes import Lane, detect_lane, enter_lane, parse_lane

LANE_MARKERS = ("cpu", "gpu", "sm90", "sm100")
MARKERS = {
    "cpu": "runs on the cpu lane (Triton interpreter, small shapes)",
    "gpu": "runs on any GPU lane",
    "sm90": "runs on the sm90 lane (Hopper)",
    "sm100": "runs on the sm100 lane (Blackwell)",
    "negative_control": "a check run against an unpinned baseline; it must fail (strict xfail)",
    "slow": "long-running; needs --run-slow",
}

_LANE: Lane | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("batchinv")
    group.addoption(
        "--lane", choices=[lane.value for lane in Lane], default=None, help="force a lane (default: detect)"
    )
    group.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    global _LANE
    forced = getattr(early_config.known_args_namespace, "lane", None)
    _LANE = parse_lane(forced) if forced else detect_lane()
    enter_lane(_LANE)


def current_lane() -> Lane:
    """The lane this pytest session runs on."""
    return _LANE if _LANE is not None else detect_lane()


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    _hypothesis_profiles()
    lane = current_lane()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if lane.is_gpu and worker:
        import torch

        count = torch.cuda.device_count()
        if count > 1:
            torch.cuda.set_device(int(worker.removeprefix("gw")) % count)


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
    lane = current_lane()
    run_slow = config.getoption("--run-slow")
    for item in items:
        names = {m.name for m in item.iter_markers()}
        reason = lane_skip_reason(names, lane)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif "slow" in names and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: needs --run-slow"))


def pytest_report_header(config: pytest.Config) -> str:
    lane = current_lane()
    text = f"batchinv lane: {lane.value}"
    if lane is Lane.CPU:
        text += f" (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')})"
    return text


@pytest.fixture(scope="session")
def lane() -> Lane:
    """The lane of this session."""
    return current_lane()


@pytest.fixture(scope="session")
def device(lane: Lane) -> Any:
    """The torch device tests of this lane put tensors on."""
    import torch

    return torch.device("cpu" if lane is Lane.CPU else "cuda")
