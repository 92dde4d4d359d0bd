"""Reading device tensors to the host in one copy.

Every device-to-host copy waits for the device (a host sync); a validation that reads several
integer tensors (lengths, a block table, index lists) reads them together.
"""

from __future__ import annotations

import torch

__all__ = ["host_int64"]


def host_int64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` (integer, any shapes, all on one device) read to the host as int64, each in its
    own shape, with one device-to-host copy for all of them.

    Raises:
        RuntimeError: tensors on different devices (``torch.cat``'s error).
    """
    flat = torch.cat([t.reshape(-1).to(torch.int64) for t in tensors]).cpu()
    parts = flat.split([t.numel() for t in tensors])
    return [part.reshape(t.shape) for part, t in zip(parts, tensors, strict=True)]
