"""harness/cuda_wait.py: a sweep worker's waits for a shared GPU sleep instead of spinning.

The cpu lane has no CUDA driver, so the driver calls are checked against a stand-in library
(the same C signatures, recording what it is asked) built from a few lines of C when a compiler
is there; the environment switch and the missing-driver path need none.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from batchinv.harness import cuda_wait

FAKE_DRIVER = r"""
static unsigned flags_seen[4]; static int set_calls; static unsigned start_flags = 0x18;
int cuInit(unsigned f) { return 0; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDevicePrimaryCtxGetState(int d, unsigned *f, int *active) { *f = start_flags | 0x2; *active = 1; return 0; }
int cuDevicePrimaryCtxSetFlags_v2(int d, unsigned f) { flags_seen[d] = f; set_calls++; return 0; }
unsigned seen(int d) { return flags_seen[d]; }
int calls(void) { return set_calls; }
"""


@pytest.fixture
def fake_driver(tmp_path: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in driver")
    src = tmp_path / "fake_cuda.c"
    src.write_text(FAKE_DRIVER)
    lib = tmp_path / "libfake_cuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_every_device_gets_blocking_sync_and_keeps_its_other_flags(fake_driver, monkeypatch):
    import ctypes

    monkeypatch.delenv(cuda_wait.WAIT_ENV, raising=False)
    assert cuda_wait.prefer_blocking_sync(str(fake_driver)) == "block"
    lib = ctypes.CDLL(str(fake_driver))
    lib.seen.restype = ctypes.c_uint
    assert lib.calls() == 2
    # spin-wait (0x2) replaced by blocking sync (0x4); map-host and lmem-resize (0x18) kept
    assert [lib.seen(d) for d in (0, 1)] == [0x1C, 0x1C]


def test_spin_leaves_cuda_alone(fake_driver, monkeypatch):
    import ctypes

    monkeypatch.setenv(cuda_wait.WAIT_ENV, "spin")
    assert cuda_wait.prefer_blocking_sync(str(fake_driver)).startswith("spin")
    assert ctypes.CDLL(str(fake_driver)).calls() == 0


def test_no_driver_is_not_an_error(monkeypatch):
    monkeypatch.delenv(cuda_wait.WAIT_ENV, raising=False)
    assert (
        cuda_wait.prefer_blocking_sync("libno_such_cuda_driver.so.1")
        == "spin (no libno_such_cuda_driver.so.1)"
    )


def test_a_bad_wait_mode_names_the_variable(monkeypatch):
    monkeypatch.setenv(cuda_wait.WAIT_ENV, "yield")
    with pytest.raises(ValueError, match="BATCHINV_CUDA_WAIT: expected one of block, spin; got 'yield'"):
        cuda_wait.prefer_blocking_sync()


def test_a_driver_without_primary_context_flags_is_not_an_error(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in driver")
    src = tmp_path / "old_cuda.c"
    src.write_text(
        "int cuInit(unsigned f) { return 0; }\nint cuDeviceGetCount(int *n) { *n = 1; return 0; }\n"
    )
    lib = tmp_path / "libold_cuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    monkeypatch.delenv(cuda_wait.WAIT_ENV, raising=False)
    assert cuda_wait.prefer_blocking_sync(str(lib)) == "spin (the driver has no primary-context flags)"


def test_a_gpu_sweep_refuses_a_bad_wait_mode_before_starting_workers(monkeypatch):
    from batchinv.harness import sweep
    from batchinv.harness.lanes import Lane

    monkeypatch.setenv(cuda_wait.WAIT_ENV, "yield")
    started = []
    monkeypatch.setattr(sweep, "get_context", lambda *a: started.append(a))
    with pytest.raises(ValueError, match="BATCHINV_CUDA_WAIT"):
        list(sweep._execute({}, [], Lane.SM90, None, jobs=2))
    assert not started
