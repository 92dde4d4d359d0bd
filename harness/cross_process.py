"""The ``cross_process`` check's other processes: one case's outputs computed again, from
scratch, in fresh interpreters (docs/DESIGN.md, "The checks").

*Deterministic at fixed shape*: the same call on the same case gives the same bits in any
process.  A kernel can be batch-invariant inside one process and still break this -- an
autotuner that times its configs once per process and takes whichever wins by noise or by a
tie-break on the hash order of their names, a heuristic keyed on a process-level input, a
cache that warms differently -- and verify-and-rollback schemes that re-run a step in another
process depend on it.  So the check is reported apart from the batch-invariance checks.

Parent side (:func:`start`, from ``checks._cross_process``): one child per seed of
:func:`child_seeds`, started together, each a *spawned* interpreter
(:class:`batchinv.harness.child_process.Child`) that differs from this process in every
process-level input the harness controls:

* ``PYTHONHASHSEED``: the check's processes always include the seeds of
  :data:`CHILD_HASH_SEEDS` (1 and 2): a sweep worker runs at 2 (:data:`WORKER_HASH_SEED`) and
  starts one child, at 1; any other process (a random seed: pytest, ``--jobs 1``) starts two.
  So a choice that follows the hash order of some names gets the same verdict everywhere,
  reproducibly: found whenever seeds 1 and 2 order those names differently (or this process's
  own seed orders them otherwise than both).  One child against a random parent would find a
  two-way tie by luck, half the time;
* an empty ``TRITON_CACHE_DIR`` (and ``TORCHINDUCTOR_CACHE_DIR``), new temporary folders: every
  kernel is compiled again;
* allocations shifted: before building the case the child holds ``k * ALLOCATION_STEP`` bytes
  on the device (best effort: the caching allocator's next blocks move by that much);
* the lane entered the same way (``BATCHINV_LANE``; on the cpu lane ``TRITON_INTERPRET=1``
  before triton is imported), the same torch thread count and the same CUDA device.

The child (:func:`main`, ``python -m batchinv.harness.cross_process SPEC``) rebuilds the case
from (component, axes, seed) with the registry's deterministic ``Component.build``, runs the
subject once under the judge's guard (:func:`batchinv.harness.isolation.guarded`: the same time
limit) and sends its outputs back (``torch.save`` to a file in the folder the parent removes).
The parent compares them bitwise with its own (:func:`batchinv.harness.invariance.cross_process`).

Subjects: the component's ``fast`` and baselines are looked up in the child's registry; an
outside subject is imported from its ``pkg.mod:attr``; any other callable from its module and
qualified name when this process can reach it there (a mutant in ``tests/mutants``).  A subject
a fresh process cannot import (a closure, a lambda, an in-process ``Subject`` without a target)
or a component that is not the registered one (its cases cannot be rebuilt) is a ``skip`` saying
why, never a pass (:func:`subject_spec`).  Cases: :func:`case_skip_reason`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from batchinv.harness import isolation
from batchinv.harness.child_process import Child, fresh_environment, send
from batchinv.harness.lanes import LANE_ENV, Lane, enter_lane
from batchinv.harness.registry import COMPONENT_MODULES, Case, Component, Outputs, get
from batchinv.harness.subjects import Subject, bound_call, import_target

#: The subject name of the component's own kernel (as ``checks.FAST``).
FAST = "fast"
#: The hash seeds (``PYTHONHASHSEED``) the check's processes always include: the children take
#: the ones this process does not run at (:func:`child_seeds`).
CHILD_HASH_SEEDS: tuple[int, ...] = (1, 2)
#: The hash seed of a sweep's worker processes (:mod:`batchinv.harness.sweep` starts them with
#: it): the last of :data:`CHILD_HASH_SEEDS`, so a worker's check needs one child, at the first.
WORKER_HASH_SEED: int = CHILD_HASH_SEEDS[-1]
#: Bytes child ``k`` (1, 2, ...) holds on the device times ``k`` before it builds the case.
ALLOCATION_STEP = 4608
#: The first this many cases of each component's list run the check on the cpu lane (each costs
#: a fresh interpreter: torch's import, the case's build, one launch in the interpreter) ...
CASES_CPU = 1
#: ... and on GPU lanes (there every kernel is compiled again, into an empty Triton cache).
CASES_GPU = 2
#: Seconds a child may spend outside the subject's call: its imports (the subject's module
#: among them), the case's build, the outputs' save (the call itself has the check's own
#: limit); with a call limit, at most :data:`STARTUP_FLOOR` or four times that limit, whichever
#: is longer (:func:`startup_limit`), so ``--timeout 5`` bounds a child that hangs in its imports.
STARTUP_LIMIT = 600.0
#: The shortest start-up a call limit allows: a fresh interpreter importing torch and triton on a
#: loaded 2-core machine takes tens of seconds.
STARTUP_FLOOR = 60.0


def startup_limit(call_limit: float | None) -> float:
    """The child's limit outside the subject's call for a check whose call limit is ``call_limit``
    (None: no call limit): :data:`STARTUP_LIMIT`, cut to ``max(STARTUP_FLOOR, 4 * call_limit)``."""
    if call_limit is None:
        return STARTUP_LIMIT
    return min(STARTUP_LIMIT, max(STARTUP_FLOOR, 4.0 * call_limit))


#: The module a child runs.
CHILD_MODULE = "batchinv.harness.cross_process"


class ChildFailed(RuntimeError):
    """A fresh process could not give the case's outputs: it died (the message names the
    signal), the subject raised there, or the case could not be rebuilt.  An ``error`` row."""


def case_skip_reason(index: int | None, lane: Lane) -> str:
    """Why the check does not run on the case at ``index`` of its component's list on ``lane``
    ("" when it runs): the first :data:`CASES_CPU` cases on the cpu lane, the first
    :data:`CASES_GPU` on GPU lanes, and any case outside the list (``index`` None: a repro)."""
    first = CASES_GPU if lane.is_gpu else CASES_CPU
    if index is None or index < first:
        return ""
    cost = "starts fresh processes and recompiles every kernel" if lane.is_gpu else "starts fresh processes"
    return (
        f"not run on this case on the {lane.value} lane: cross_process runs on the first {first} "
        f"case(s) of each component there (it {cost}: seconds per case)"
    )


def importable(fn: Any) -> str | None:
    """``pkg.mod:qualname`` of ``fn`` when that path leads back to ``fn`` itself in this
    process (a module-level function or class attribute); None for a closure, a lambda, a
    ``functools.partial``, a wrapper whose ``__wrapped__`` names another function, or a
    function of ``__main__``."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if "<" in qualname or module == "__main__":
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return f"{module}:{qualname}" if obj is fn else None


def _registered(component: Component) -> Component | None:
    """The registry's entry of ``component``'s name when it builds cases the same way (the
    child rebuilds them from it); None otherwise."""
    if component.name not in COMPONENT_MODULES:
        return None
    entry = get(component.name)
    return entry if entry.build is component.build else None


def subject_spec(component: Component, subject: str | Subject) -> dict[str, Any] | str:
    """How a fresh process finds the subject: a JSON-able spec for :func:`main`, or why it
    cannot (a ``skip`` reason).

    ``{"kind": "fast"}`` / ``{"kind": "baseline", "name": ...}``: the registry's own;
    ``{"kind": "callable", "target": "pkg.mod:attr"}``: another callable in the component's
    ``fast`` or a baseline's place (a mutant), called as they are; ``{"kind": "outside", ...}``:
    an outside :class:`Subject`, imported from its target and bound as the parent binds it.
    """
    registered = _registered(component)
    if registered is None:
        return (
            f"component {component.name!r} is not the registered one (its name is not in the "
            "registry, or its build differs): a fresh process cannot rebuild its cases"
        )
    if isinstance(subject, Subject):  # as a sweep's worker process, from its import path
        if subject.target is None:
            return (
                f"subject {subject.name!r} is an in-process callable without an import path "
                "('pkg.mod:attr'): a fresh process cannot import it"
            )
        return {"kind": "outside", "name": subject.name, "target": subject.target, "role": subject.role}
    if subject == FAST:
        fn, shipped, spec = component.fast, registered.fast, {"kind": "fast"}
    else:
        fn = component.baseline(subject).fn
        shipped = next((b.fn for b in registered.baselines if b.name == subject), None)
        spec = {"kind": "baseline", "name": subject}
    if fn is shipped:
        return spec
    target = importable(fn)
    if target is None:
        what = getattr(fn, "__qualname__", type(fn).__name__)
        return (
            f"the subject {subject!r} is an in-process callable ({what}) that a fresh process "
            "cannot import by its module and name"
        )
    return {"kind": "callable", "target": target}


_OWN_SEED: list[int | None] = []


def own_hash_seed() -> int | None:
    """This process's ``PYTHONHASHSEED`` when it is one of :data:`CHILD_HASH_SEEDS` and this
    process's ``hash`` is that seed's (checked once against a bare interpreter started with it:
    the variable may have been set after this process started); None otherwise (a random seed)."""
    if _OWN_SEED:
        return _OWN_SEED[0]
    found: int | None = None
    text = os.environ.get("PYTHONHASHSEED", "")
    if text.isdigit() and int(text) in CHILD_HASH_SEEDS:
        probe = "batchinv cross_process probe"
        env = {**os.environ, "PYTHONHASHSEED": text}
        try:
            done = subprocess.run(
                [sys.executable, "-S", "-c", f"print(hash({probe!r}))"],
                env=env, capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            if done.stdout.strip() == str(hash(probe)):
                found = int(text)
        except (OSError, subprocess.SubprocessError):
            found = None
    _OWN_SEED.append(found)
    return found


def child_seeds() -> tuple[int, ...]:
    """The children's hash seeds: :data:`CHILD_HASH_SEEDS` less this process's own
    (:func:`own_hash_seed`).  So the check's processes always include every seed of the tuple,
    and its verdict on a choice that follows the hash order of some names is the same in a
    sweep worker (one child) as in any other process (two): found whenever those seeds order
    the names differently, or this process's own seed orders them otherwise than both."""
    own = own_hash_seed()
    return tuple(s for s in CHILD_HASH_SEEDS if s != own)


def _label(seed: int) -> str:
    return f"fresh process PYTHONHASHSEED={seed}"


@dataclass
class Children:
    """The fresh processes of one check, started; :meth:`outputs` waits for them."""

    children: list[tuple[str, Child, Path]]
    folder: str
    _closed: bool = field(default=False, repr=False)

    def outputs(self) -> dict[str, Outputs]:
        """Each child's outputs, by label (``fresh process PYTHONHASHSEED=1``), on the CPU.

        Raises:
            SubjectTimeout: a child was killed past a limit, or its subject call timed out.
            ChildFailed: a child died (naming the signal) or reported an error.
        """
        out: dict[str, Outputs] = {}
        for label, child, path in self.children:
            ended = child.wait()
            if ended.killed:
                raise isolation.SubjectTimeout(f"{label}: {ended.killed}")
            done = ended.last("done")
            if done is None:
                where = "during the subject's call" if ended.in_call else "outside the subject's call"
                tail = ended.stderr_tail.splitlines()[-1:] or ["no output"]
                raise ChildFailed(f"{label} died ({ended.how}) {where}: {tail[0]}")
            if done.get("status") == "timeout":
                raise isolation.SubjectTimeout(f"{label}: {done.get('detail', '')}")
            if done.get("status") != "ok":
                raise ChildFailed(f"{label}: {done.get('detail', 'no detail')}")
            tensors = torch.load(path, weights_only=True)
            out[label] = tuple(tensors)
        return out

    def close(self) -> None:
        """Kill the children still running and remove their folder (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for _, child, _ in self.children:
            child.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(
    component: Component,
    spec: dict[str, Any],
    case: Case,
    lane: Lane,
    device: torch.device,
    limit: float | None,
) -> Children:
    """Start one fresh process per seed of :func:`child_seeds` computing ``case``'s
    outputs for the subject ``spec`` (:func:`subject_spec`); ``limit``: the subject call's
    limit in seconds (None: none).  The caller must :meth:`Children.close` them."""
    folder = tempfile.mkdtemp(prefix="batchinv-cross-process-")
    children: list[tuple[str, Child, Path]] = []
    try:
        index = (
            device.index
            if device.index is not None
            else (torch.cuda.current_device() if device.type == "cuda" else None)
        )
        for k, seed in enumerate(child_seeds(), start=1):
            work = Path(folder) / f"child-{k}"
            work.mkdir()
            outputs = work / "outputs.pt"
            child_spec = {
                "component": component.name,
                "subject": spec,
                "axes": dict(case.axes),
                "seed": case.seed,
                "lane": lane.value,
                "device": device.type,
                "device_index": index,
                "limit": limit,
                "threads": torch.get_num_threads(),
                "allocation": k * ALLOCATION_STEP,
                "outputs": str(outputs),
                "parent_pid": os.getpid(),
            }
            spec_path = work / "spec.json"
            spec_path.write_text(json.dumps(child_spec), encoding="utf-8")
            overrides = {
                "PYTHONHASHSEED": str(seed),
                "TRITON_CACHE_DIR": str(work / "triton-cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache"),
                LANE_ENV: lane.value,
            }
            if lane is Lane.CPU:
                overrides["TRITON_INTERPRET"] = "1"
            env = fresh_environment(**overrides)
            child = Child(
                CHILD_MODULE, [str(spec_path)], env, startup_limit=startup_limit(limit), call_limit=limit
            )
            children.append((_label(seed), child, outputs))
    except BaseException:
        Children(children, folder).close()
        raise
    return Children(children, folder)


# --- the child ------------------------------------------------------------------------------------


def _resolve(spec: dict[str, Any], component: Component) -> Callable[..., Any]:
    kind = spec["kind"]
    if kind == FAST:
        return component.fast
    if kind == "baseline":
        return component.baseline(spec["name"]).fn
    if kind == "callable":
        fn: Callable[..., Any] = import_target(spec["target"])
        return fn
    if kind == "outside":
        return bound_call(component, Subject(spec["name"], spec["target"], None, spec["role"]))
    raise ValueError(f"subject spec: expected kind fast, baseline, callable or outside; got {kind!r}")


def _last_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


#: Seconds between a child's looks at whether its parent still runs (:func:`exit_with_parent`).
PARENT_POLL_S = 0.5


def exit_with_parent(parent_pid: int, folder: Path) -> threading.Thread:
    """Watch, from a daemon thread, that the process ``parent_pid`` is still this child's parent;
    when it is not (the parent was killed: a sweep worker past its watchdog, or ended by SIGTERM
    without running its ``finally``), remove the check's ``folder`` (the children's outputs and
    Triton caches) and end this process at once (exit status 3): an orphan would go on building
    its case on the device beside the worker that replaces its parent."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(3)

    thread = threading.Thread(target=watch, name="batchinv-exit-with-parent", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> int:
    """A child: read the spec file ``argv[0]``, enter its lane, rebuild the case, run the
    subject once and send the outputs (events of :mod:`batchinv.harness.child_process`); it
    ends with its parent (:func:`exit_with_parent`)."""
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if spec.get("parent_pid") is not None:  # the check's folder: the parent of this child's own
        exit_with_parent(int(spec["parent_pid"]), Path(spec["outputs"]).parent.parent)
    lane = Lane(spec["lane"])
    enter_lane(lane)  # before anything imports triton (the environment has it too)
    try:
        torch.set_num_threads(int(spec["threads"]))
        if spec["device"] == "cuda" and spec["device_index"] is not None:
            torch.cuda.set_device(int(spec["device_index"]))
        device = (
            torch.device(spec["device"], spec["device_index"])
            if spec["device"] == "cuda"
            else torch.device("cpu")
        )
        shift = torch.empty(int(spec["allocation"]), dtype=torch.uint8, device=device)  # held to the end
        component = get(spec["component"])
        fn = _resolve(spec["subject"], component)
        batch = component.build(Case(component.name, spec["axes"], int(spec["seed"])), device)
    except BaseException as exc:
        send({"event": "done", "status": "error", "detail": f"could not set up the case: {_last_line(exc)}"})
        return 1
    from batchinv.harness.invariance import inputs_untouched
    from batchinv.harness.registry import as_outputs

    call = isolation.guarded(fn, spec["limit"], component)
    send({"event": "call"})
    try:
        with inputs_untouched(batch):
            out = as_outputs(call(**batch.kwargs()))
    except isolation.SubjectTimeout as exc:
        send({"event": "called"})
        send({"event": "done", "status": "timeout", "detail": f"a call of the subject timed out: {exc}"})
        return 1
    except BaseException as exc:
        send({"event": "called"})
        send({"event": "done", "status": "error", "detail": f"the subject raised: {_last_line(exc)}"})
        return 1
    send({"event": "called"})
    torch.save([t.detach().cpu().clone() for t in out], spec["outputs"])
    del shift
    send({"event": "done", "status": "ok"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
