"""The incremental JSON-lines report: one line per check, flushed as it is written, so a crash
keeps everything done so far.  The first line is a header (lane, device, versions, flush-to-zero
probe); the last, when the run completes, a summary."""

from __future__ import annotations

import datetime as _dt
import json
import platform
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from batchinv.harness import strict_json
from batchinv.harness.checks import CheckResult
from batchinv.harness.lanes import Lane

#: The batchinv source tree (the folder holding ``harness/``): a checkout's top level, or the
#: package folder of an installed copy.
_SOURCE_ROOT = Path(__file__).resolve().parents[1]


def git_revision() -> str | None:
    """The git revision of the batchinv source tree (``-dirty`` when it has uncommitted changes),
    else ``$GITHUB_SHA`` (a CI checkout), else None (an installed wheel)."""
    import os
    import subprocess

    root = _SOURCE_ROOT
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if rev.returncode == 0 and rev.stdout.strip():
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("GITHUB_SHA") or None


def git_tree(root: Path | None = None) -> str | None:
    """The git tree id of the source tree as it is on disk: every tracked file that exists and
    every untracked file git does not ignore, at its current content (None without git or
    outside a repository).

    :func:`git_revision` names the commit checked out, which says nothing of a tree copied over
    an older checkout (a device machine's copy read ``bc6ccdc18308-dirty`` for three different
    trees, runs 66-68).  The tree id names the files themselves: a clean checkout's equals
    ``git rev-parse HEAD^{tree}``, and the commit a report came from is the one whose tree id
    it is (``git log --format='%H %T' | grep TREE``).  Built in a temporary index with
    ``git update-index --info-only`` (the files are hashed, nothing is written to the
    repository) and ``git write-tree --missing-ok``; a fraction of a second.

    ``root``: the repository's top level (default: the batchinv source tree's); a folder inside
    another repository (a copy installed into a virtual environment kept in some checkout) or
    one with no files gives None, never the id of an unrelated or empty tree."""
    import os
    import subprocess
    import tempfile

    root = root if root is not None else _SOURCE_ROOT
    try:
        prefix = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-prefix"], capture_output=True, text=True, timeout=10
        )
        if prefix.returncode != 0 or prefix.stdout.strip():
            return None  # not a repository, or a folder inside another one (an installed copy)
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=30,
        )
        if listed.returncode != 0:
            return None
        paths = sorted({p for p in listed.stdout.split(b"\0") if p and (root / os.fsdecode(p)).exists()})
        if not paths:
            return None
        with tempfile.TemporaryDirectory(prefix="batchinv-git-tree-") as folder:
            env = {**os.environ, "GIT_INDEX_FILE": str(Path(folder) / "index")}
            added = subprocess.run(
                ["git", "-C", str(root), "update-index", "--add", "--info-only", "-z", "--stdin"],
                input=b"".join(p + b"\0" for p in paths),
                capture_output=True,
                env=env,
                timeout=60,
            )
            tree = subprocess.run(
                ["git", "-C", str(root), "write-tree", "--missing-ok"],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
            )
        if added.returncode == 0 and tree.returncode == 0 and tree.stdout.strip():
            return tree.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def environment(lane: Lane) -> dict[str, Any]:
    """Date, lane, device name, SM count, torch / triton / CUDA versions, flush-to-zero probe,
    the git revision (:func:`git_revision`) and the tree's id as it is on disk
    (:func:`git_tree`)."""
    import torch

    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "git_tree": git_tree(),
        "lane": lane.value,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        info["triton"] = None
    from batchinv.harness.bitpatterns import probe_flush_to_zero

    if lane.is_gpu:
        props = torch.cuda.get_device_properties(0)
        info["device"] = props.name
        info["sm_count"] = props.multi_processor_count
        info["capability"] = f"{props.major}.{props.minor}"
        info.update(probe_flush_to_zero("cuda"))
    else:
        info["device"] = f"cpu ({platform.machine()}), Triton interpreter"
        info.update(probe_flush_to_zero("cpu"))
    return info


class JsonlReport:
    """Append-only JSON-lines writer (``None`` path: write nothing)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("w", encoding="utf-8")

    def write(self, kind: str, payload: dict[str, Any]) -> None:
        if self._fh is None:
            return
        self._fh.write(strict_json.dumps({"kind": kind, **payload}) + "\n")
        self._fh.flush()

    def check(self, result: CheckResult) -> None:
        if self._fh is None:
            return
        self._fh.write('{"kind": "check", ' + result.to_json()[1:] + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonlReport:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_report(path: Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines report (a truncated last line is ignored)."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records
