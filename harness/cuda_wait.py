"""How a process that shares one GPU with others waits for it: sleep, not spin.

CUDA's default scheduling (``cudaDeviceScheduleAuto``) spins a host thread that waits for the
device -- a ``.item()``, ``torch.equal``, ``.cpu()``, ``torch.cuda.synchronize()`` -- whenever the
process has fewer active contexts than the machine has cores, which is always true of one
process.  A sweep's GPU workers are twelve processes, one context each, sharing one GPU that
runs one context at a time (time-slicing): a worker waiting for its turn spins one core at 100%
for the whole wait, and twelve of them leave little to the work that needs the cores -- Triton
compiling, the ``cross_process`` checks' fresh interpreters, the other workers' Python.  The
sampler of run 73 (H100) saw the CPUs 76% busy while the GPU was the bound.

:func:`prefer_blocking_sync` sets ``CU_CTX_SCHED_BLOCKING_SYNC`` on every device's primary context
(the one the CUDA runtime, and so torch, uses): a waiting thread sleeps in the driver and is woken
when the work is done, at the price of the wake-up (microseconds per wait).  It changes no
device setting and nothing another process sees, and it changes no result: only how this
process's host threads wait.  The driver is reached through ``libcuda.so.1`` (ctypes), so it
needs no CUDA runtime of its own and runs before torch creates its context.

Environment: ``BATCHINV_CUDA_WAIT`` = ``block`` (the default where this is called) or ``spin``
(leave CUDA's default; for an A/B of the two).
"""

from __future__ import annotations

import ctypes
import os

#: ``CU_CTX_SCHED_BLOCKING_SYNC`` (cuda.h): block the host thread on a synchronization primitive.
CU_CTX_SCHED_BLOCKING_SYNC = 0x04
#: ``CU_CTX_SCHED_MASK``: the scheduling bits of a context's flags (the others are kept).
CU_CTX_SCHED_MASK = 0x07
#: The environment variable that chooses how waits are made (``block`` or ``spin``).
WAIT_ENV = "BATCHINV_CUDA_WAIT"
WAIT_MODES = ("block", "spin")


def wait_mode() -> str:
    """``BATCHINV_CUDA_WAIT`` (default ``block``).

    Raises:
        ValueError: another value (naming the variable, the expected and the given value).
    """
    mode = os.environ.get(WAIT_ENV, "block").strip().lower() or "block"
    if mode not in WAIT_MODES:
        raise ValueError(f"{WAIT_ENV}: expected one of {', '.join(WAIT_MODES)}; got {mode!r}")
    return mode


def prefer_blocking_sync(library: str = "libcuda.so.1") -> str:
    """Make this process's waits for any CUDA device sleep instead of spin (unless
    ``BATCHINV_CUDA_WAIT=spin``).  Call it in a process that shares a GPU, before or after torch
    initialises CUDA (the driver allows changing a primary context's flags while it is active).

    Returns:
        What was done, for a log line: ``"block"``, ``"spin (BATCHINV_CUDA_WAIT)"``, or why
        nothing was (no driver library, no device, a driver call's error code).  Never raises
        for a missing or failing driver: waiting by spinning is CUDA's default and still correct.

    Raises:
        ValueError: ``BATCHINV_CUDA_WAIT`` is neither ``block`` nor ``spin``.
    """
    if wait_mode() == "spin":
        return f"spin ({WAIT_ENV})"
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return f"spin (no {library})"
    status = cuda.cuInit(0)
    if status != 0:
        return f"spin (cuInit: error {status})"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0 or count.value == 0:
        return f"spin (no device: error {status})"
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or getattr(
        cuda, "cuDevicePrimaryCtxSetFlags", None
    )
    get_state = getattr(cuda, "cuDevicePrimaryCtxGetState", None)
    if set_flags is None or get_state is None:
        return "spin (the driver has no primary-context flags)"
    for ordinal in range(count.value):
        device, flags, active = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
        status = cuda.cuDeviceGet(ctypes.byref(device), ordinal)
        if status == 0:
            status = get_state(device, ctypes.byref(flags), ctypes.byref(active))
        if status == 0:  # the scheduling bits replaced, every other flag kept
            wanted = (flags.value & ~CU_CTX_SCHED_MASK) | CU_CTX_SCHED_BLOCKING_SYNC
            status = set_flags(device, ctypes.c_uint(wanted))
        if status != 0:
            return f"spin (device {ordinal}: error {status})"
    return "block"
