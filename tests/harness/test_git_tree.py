"""The report header's ``git_tree``: the id of the source tree as it is on disk, so a report
names the files that ran even where the checkout's commit is stale (a device machine's copy
read ``bc6ccdc18308-dirty`` for three different trees, runs 66-68).  Checked on a throwaway
repository against what git itself records when the same files are committed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from batchinv.harness.lanes import Lane
from batchinv.harness.report import environment, git_tree

pytestmark = [
    pytest.mark.cpu,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _commit_all(repo: Path) -> str:
    """Commit every file as it is on disk; the commit's tree id."""
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    return _git(repo, "rev-parse", "HEAD^{tree}")


def test_the_tree_id_names_the_files_on_disk_as_a_commit_of_them_would(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "pkg" / "kernel.py").write_text("TILE = 512\n")
    (repo / "gone.py").write_text("x = 1\n")
    first = _commit_all(repo)
    assert git_tree(repo) == first  # a clean checkout: HEAD's tree

    (repo / "pkg" / "kernel.py").write_text("TILE = 8192\n")  # a changed file
    (repo / "pkg" / "new.py").write_text("y = 2\n")  # an untracked file git does not ignore
    (repo / "ignored.txt").write_text("not source\n")  # an ignored one
    (repo / "gone.py").unlink()  # a tracked file deleted
    on_disk = git_tree(repo)
    assert on_disk is not None and on_disk != first
    objects_before = sorted(p.name for p in (repo / ".git" / "objects").rglob("*") if p.is_file())
    assert git_tree(repo) == on_disk  # the same files, the same id; nothing written to the repo
    assert sorted(p.name for p in (repo / ".git" / "objects").rglob("*") if p.is_file()) == objects_before
    assert _commit_all(repo) == on_disk  # what a commit of exactly those files records
    assert "ignored.txt" not in _git(repo, "ls-tree", "-r", "--name-only", "HEAD")


def test_no_repository_a_folder_inside_one_or_no_files_gives_none(tmp_path: Path):
    assert git_tree(tmp_path) is None
    repo = tmp_path / "repo"
    (repo / "site-packages" / "batchinv").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "top.py").write_text("z = 3\n")
    _commit_all(repo)
    (repo / "site-packages" / "batchinv" / "report.py").write_text("")
    assert git_tree(repo / "site-packages" / "batchinv") is None  # an installed copy: not its tree
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert git_tree(empty) is None


def test_the_header_carries_it():
    header = environment(Lane.CPU)
    assert "git_tree" in header
    if header["git_tree"] is not None:  # a checkout (an installed wheel has no tree)
        assert len(header["git_tree"]) in (40, 64)
