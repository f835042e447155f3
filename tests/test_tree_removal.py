"""Removing a folder candidate code wrote (tree_removal.py): never through a link, any
depth, folders made unreadable or read-only included, and never an exception. The
attacks that turned shutil.rmtree's handler against the parent needed a user other
than root (root skips the permission checks that made the handler run), so they run
here as an unprivileged user where the tests run as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from pike.evaluate.tree_removal import remove_tree

MODULE = Path(__file__).parents[1] / "src" / "pike" / "evaluate" / "tree_removal.py"
NOBODY = 65534


def _python_for(user: int | None) -> str | None:
    """An interpreter `user` may run: pike's own may live in root's home (pyenv), so the
    system's python3 too (the module needs nothing but the standard library)."""
    for python in (sys.executable, sys._base_executable, "/usr/bin/python3"):
        try:
            done = subprocess.run([python, "-c", "print(1)"], user=user, capture_output=True,
                                  timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return python
    return None


_USER = NOBODY if os.getuid() == 0 else None
_PYTHON = _python_for(_USER)
needs_unprivileged = pytest.mark.skipif(
    _PYTHON is None or not os.access(MODULE, os.R_OK),
    reason="cannot run a process as an unprivileged user")


def _as_unprivileged(script: str) -> subprocess.CompletedProcess[str]:
    """`script` with remove_tree in scope, run by a user other than root."""
    loader = textwrap.dedent(f"""
        import importlib.util, os, sys
        spec = importlib.util.spec_from_file_location("tree_removal", {str(MODULE)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        remove_tree = module.remove_tree
    """)
    assert _PYTHON is not None
    return subprocess.run([_PYTHON, "-c", loader + textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120, user=_USER)


@pytest.fixture
def shared_dir() -> Path:
    """A folder the unprivileged user may write (pytest's own are the running user's)."""
    folder = Path(tempfile.mkdtemp(prefix="pike-test-removal-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_unprivileged
def test_a_link_in_a_read_only_folder_never_has_its_target_changed(shared_dir: Path) -> None:
    """The old handler chmod-ed `folder/link` to 0755 after the unlink in a read-only
    folder failed: the link's target, a user's key, became readable to all."""
    done = _as_unprivileged(f"""
        base = {str(shared_dir)!r}
        secret = os.path.join(base, "secret"); open(secret, "w").write("key")
        os.chmod(secret, 0o600)
        work = os.path.join(base, "work")
        os.makedirs(work + "/ro"); os.symlink(secret, work + "/ro/link")
        os.symlink(base, work + "/to_base")
        os.chmod(work + "/ro", 0o500)
        print(remove_tree(work), os.path.lexists(work), oct(os.stat(secret).st_mode & 0o777))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "0o600"]
    assert (shared_dir / "secret").read_text() == "key"


@needs_unprivileged
def test_folders_made_unreadable_are_removed_without_an_exception(shared_dir: Path) -> None:
    """The old handler called os.open without its flags for a folder it could not read:
    TypeError, out of the evaluation removing the candidate's folder."""
    done = _as_unprivileged(f"""
        work = os.path.join({str(shared_dir)!r}, "work")
        os.makedirs(work + "/x/y/z"); open(work + "/x/y/z/f", "w").write("1")
        os.chmod(work + "/x/y", 0); os.chmod(work + "/x", 0o100)
        print(remove_tree(work), os.path.lexists(work))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        os.mkdir("deep", dir_fd=fd)
        current = os.open("deep", os.O_RDONLY, dir_fd=fd)
        for _ in range(sys.getrecursionlimit() + 200):  # paths past PATH_MAX: by handle
            os.mkdir("d", dir_fd=current)
            below = os.open("d", os.O_RDONLY, dir_fd=current)
            os.close(current)
            current = below
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=current))
        os.close(current)
    finally:
        os.close(fd)
    assert remove_tree(deep) is True
    assert os.listdir(tmp_path) == []


def test_a_link_given_is_removed_alone_and_a_missing_path_is_gone(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "kept")
    assert remove_tree(tmp_path / "link") is True
    assert (tmp_path / "kept" / "f").read_text() == "x"
    assert remove_tree(tmp_path / "never") is True


def test_a_tree_of_files_links_and_folders_goes(tmp_path: Path) -> None:
    top = tmp_path / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_bytes(b"x" * 4096)
    (top / "a" / "l").symlink_to("/")
    (top / "g").write_text("y")
    (top / "a" / "b").chmod(0o500)
    assert remove_tree(top) is True
    assert not top.exists()


def test_a_candidate_leaving_a_deep_tree_is_judged(mlp_task, fast_config) -> None:  # type: ignore[no-untyped-def]
    """Before tree_removal, the evaluation itself raised RecursionError while removing the
    candidate's folder, on any host. Its folders go past what the disk poll reads, which
    ends it where a poll comes before its evaluation ends (on a loaded host a short
    evaluation may end first); the point here is that a verdict comes back."""
    from pike.evaluate import evaluate
    from tests.conftest import candidate

    verdict = evaluate(mlp_task, candidate("nests_folders_deep"), fast_config)
    assert verdict.status in ("ok", "crashed"), verdict.message
    if verdict.status == "crashed":
        assert "folders deep" in verdict.message


def test_a_link_is_never_opened_as_a_folder(tmp_path: Path) -> None:
    """What keeps a folder swapped for a link mid-walk from being entered: the opens
    themselves refuse links (the walk unlinks a link first, so only a swap reaches them)."""
    from pike.evaluate.tree_removal import open_folder

    (tmp_path / "outside").mkdir()
    (tmp_path / "outside").chmod(0o500)
    (tmp_path / "link").symlink_to(tmp_path / "outside")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert open_folder(fd, "link") is None
    finally:
        os.close(fd)
    assert (tmp_path / "outside").stat().st_mode & 0o777 == 0o500


@needs_unprivileged
def test_a_link_to_an_unreadable_folder_is_never_changed(shared_dir: Path) -> None:
    """The other open, for a folder made unreadable, refuses links too."""
    done = _as_unprivileged(f"""
        base = {str(shared_dir)!r}
        os.mkdir(base + "/outside"); os.chmod(base + "/outside", 0)
        os.symlink(base + "/outside", base + "/link")
        fd = os.open(base, os.O_RDONLY)
        print(module.open_folder(fd, "link"), oct(os.lstat(base + "/outside").st_mode & 0o777))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "0o0"]


def test_folders_swapped_for_links_while_it_runs_leave_the_outside_alone(
        tmp_path: Path) -> None:
    """The shared build cache is written by running candidates while it is trimmed: a
    process flips folders of the tree between a folder and a link to one outside, over
    and over, while the tree is removed again and again."""
    outside = tmp_path / "outside"
    (outside / "inner").mkdir(parents=True)
    (outside / "inner" / "kept").write_text("x")
    top = tmp_path / "top"
    swapper = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        top, outside = {str(top)!r}, {str(outside)!r}
        end = time.monotonic() + 4
        while time.monotonic() < end:
            try:
                os.makedirs(top + "/d/a/inner", exist_ok=True)
                open(top + "/d/a/inner/f", "w").close()
                os.rename(top + "/d/a", top + "/d/a.x")
                os.symlink(outside, top + "/d/a")
                os.unlink(top + "/d/a")
                os.rename(top + "/d/a.x", top + "/d/a")
                os.rename(top + "/d", top + "/d.x")
                os.symlink(outside, top + "/d")
                os.unlink(top + "/d")
                os.rename(top + "/d.x", top + "/d")
            except OSError:
                pass
    """)])
    try:
        while swapper.poll() is None:
            remove_tree(top)
    finally:
        swapper.wait(timeout=30)
    assert (outside / "inner" / "kept").read_text() == "x"


def test_odd_paths_are_refused_not_taken_for_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x").write_text("kept")
    monkeypatch.chdir(tmp_path)
    for odd in ("", ".", "..", "a\0b", "/"):
        assert remove_tree(odd) is False
    assert (tmp_path / "x").read_text() == "kept"
