"""Lanes: where a test or a sweep runs.

* ``cpu``: no GPU; every Triton kernel runs in the interpreter (``TRITON_INTERPRET=1`` must be
  set before triton is imported), with small shapes.
* ``sm90``: compute capability 9.x (Hopper: H100, H200).
* ``sm100``: compute capability 10.x (Blackwell: B200, GB200).

``gpu`` is not a lane but a marker meaning "any GPU lane".
"""

from __future__ import annotations

import enum
import os
import sys


class Lane(enum.StrEnum):
    CPU = "cpu"
    SM90 = "sm90"
    SM100 = "sm100"

    @property
    def is_gpu(self) -> bool:
        return self is not Lane.CPU


LANE_ENV = "BATCHINV_LANE"


def detect_lane() -> Lane:
    """The lane of this machine: ``$BATCHINV_LANE`` if set, else from the first visible GPU.

    A GPU of an architecture without a lane (for example sm80) falls back to ``cpu``.
    """
    forced = os.environ.get(LANE_ENV)
    if forced:
        return parse_lane(forced)
    import torch

    if not torch.cuda.is_available():
        return Lane.CPU
    major, _ = torch.cuda.get_device_capability(0)
    if major == 9:
        return Lane.SM90
    if major == 10:
        return Lane.SM100
    return Lane.CPU


def parse_lane(text: str) -> Lane:
    """Parse a lane name; raises ``ValueError`` naming the accepted values."""
    try:
        return Lane(text.lower())
    except ValueError:
        accepted = ", ".join(lane.value for lane in Lane)
        raise ValueError(f"lane: expected one of {accepted}, got {text!r}") from None


def enter_lane(lane: Lane) -> None:
    """Prepare the process for ``lane``; call before anything imports triton.

    On the cpu lane this sets ``TRITON_INTERPRET=1``.  If triton was already imported without
    it, the interpreter cannot be switched on any more and a ``RuntimeError`` says so.
    """
    os.environ[LANE_ENV] = lane.value
    if lane is Lane.CPU:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "the cpu lane needs TRITON_INTERPRET=1 before triton is imported; "
                "triton was already imported without it"
            )
        os.environ["TRITON_INTERPRET"] = "1"


def lane_device(lane: Lane) -> str:
    """The torch device string tensors of ``lane`` live on."""
    return "cpu" if lane is Lane.CPU else "cuda"


def under_torchrun() -> bool:
    """Whether this process is a rank started by ``torchrun`` (its environment is set): the
    multi-GPU lane (``gpu_2``, ``gpu_4`` tests; ``ci/multi_gpu.sh``)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(
        k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    )
