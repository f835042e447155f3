"""The reference's torch.compile builds reach the candidates' build cache, one way only,
and nothing planted in the candidates' cache can turn the copy elsewhere."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pike.agents.offline import render
from pike.config import EvalConfig
from pike.evaluate import evaluate, shared_builds
from pike.evaluate.baseline import measure_baselines
from pike.evaluate.child_launch import build_cache_root
from pike.evaluate.shared_builds import share_reference_builds
from pike.task import Task


def _config(tmp_path: Path) -> EvalConfig:
    return EvalConfig(device="cpu", build_cache=tmp_path / "build")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, EvalConfig]:
    cfg = _config(tmp_path)
    reference, candidates = build_cache_root(cfg, "reference"), build_cache_root(cfg, "candidate")
    _write(reference / "inductor" / "fxgraph" / "ab" / "key" / "entry", "graph")
    _write(reference / "inductor" / "cd" / "ccode.py", "kernel = 1")
    _write(reference / "inductor" / "locks" / "held.lock", "")
    _write(reference / "triton" / "hash1" / "k.cubin", "binary")
    _write(reference / "triton" / "hash1" / "__grp__k.json", "{}")
    _write(reference / "ext_build_key" / "module.so", "an extension of the reference's")
    return reference, candidates, cfg


def test_the_reference_caches_files_are_copied_where_missing(
        roots: tuple[Path, Path, EvalConfig]) -> None:
    reference, candidates, cfg = roots
    assert share_reference_builds(cfg) == 4
    for rel in ("inductor/fxgraph/ab/key/entry", "inductor/cd/ccode.py", "triton/hash1/k.cubin",
                "triton/hash1/__grp__k.json"):
        assert (candidates / rel).read_bytes() == (reference / rel).read_bytes()
    # locks are the reference's own; extension builds are not inductor's or Triton's
    assert not (candidates / "inductor" / "locks").exists()
    assert not (candidates / "ext_build_key").exists()
    assert not list(candidates.rglob("*.part"))  # every file renamed into place
    assert share_reference_builds(cfg) == 0  # once is enough


def test_a_file_the_candidates_have_is_left_as_it_is(
        roots: tuple[Path, Path, EvalConfig]) -> None:
    _, candidates, cfg = roots
    _write(candidates / "inductor" / "cd" / "ccode.py", "a candidate's")
    share_reference_builds(cfg)
    assert (candidates / "inductor" / "cd" / "ccode.py").read_text() == "a candidate's"


def test_a_link_that_appears_at_the_name_meanwhile_is_replaced_not_written_through(
        roots: tuple[Path, Path, EvalConfig], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a candidate racing the copy: the name was free when looked at, a link when written
    _, candidates, cfg = roots
    victim = _write(tmp_path / "victim.txt", "mine")
    target = candidates / "inductor" / "cd" / "ccode.py"
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    monkeypatch.setattr(shared_builds, "_present", lambda name, folder: False)
    share_reference_builds(cfg)
    assert victim.read_text() == "mine"
    assert not target.is_symlink() and target.read_text() == "kernel = 1"


def test_what_a_candidate_leaves_in_its_cache_never_fails_the_copy(
        roots: tuple[Path, Path, EvalConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    # a folder left unsearchable (a root pike is not stopped by its mode, so the refusal
    # is made up here), a FIFO and a folder where files are expected
    _, candidates, cfg = roots
    (candidates / "triton" / "hash1").mkdir(parents=True)
    os.mkfifo(candidates / "triton" / "hash1" / "__grp__k.json")  # opened, it would block
    (candidates / "inductor" / "fxgraph" / "ab" / "key" / "entry").mkdir(parents=True)
    real_stat = os.stat

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if path == "ccode.py":
            raise PermissionError(13, "Permission denied", path)
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shared_builds.os, "stat", stat)
    share_reference_builds(cfg)  # raises nothing
    assert not (candidates / "inductor" / "cd" / "ccode.py").exists()
    assert (candidates / "triton" / "hash1" / "k.cubin").read_text() == "binary"


def test_with_a_start_time_only_folders_changed_since_are_copied(
        roots: tuple[Path, Path, EvalConfig]) -> None:
    reference, candidates, cfg = roots
    old = time.time() - 3600
    os.utime(reference / "inductor" / "cd", (old, old))  # another task's, an hour ago
    assert share_reference_builds(cfg, since=time.time() - 60) == 3
    assert not (candidates / "inductor" / "cd" / "ccode.py").exists()
    assert share_reference_builds(cfg) == 1  # without: everything missing


def test_links_planted_in_the_candidates_cache_lead_the_copy_nowhere(
        roots: tuple[Path, Path, EvalConfig], tmp_path: Path) -> None:
    reference, candidates, cfg = roots
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = _write(tmp_path / "victim.txt", "mine")
    candidates.mkdir(parents=True, exist_ok=True)
    (candidates / "inductor").symlink_to(elsewhere, target_is_directory=True)
    (candidates / "triton").mkdir()
    (candidates / "triton" / "hash1").mkdir()
    (candidates / "triton" / "hash1" / "k.cubin").symlink_to(victim)
    share_reference_builds(cfg)
    assert list(elsewhere.iterdir()) == []  # the linked folder was not entered
    assert victim.read_text() == "mine"  # the linked file was not written through
    assert (candidates / "triton" / "hash1" / "__grp__k.json").read_text() == "{}"


def test_links_in_the_reference_cache_are_not_copied(
        roots: tuple[Path, Path, EvalConfig], tmp_path: Path) -> None:
    reference, candidates, cfg = roots
    secret = _write(tmp_path / "outside.txt", "not the reference's build")
    (reference / "inductor" / "cd" / "link.py").symlink_to(secret)
    share_reference_builds(cfg)
    assert not (candidates / "inductor" / "cd" / "link.py").exists()


def test_triton_group_files_come_after_the_files_they_name(
        roots: tuple[Path, Path, EvalConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, cfg = roots
    order: list[str] = []
    copy = shared_builds._copy_file
    monkeypatch.setattr(shared_builds, "_copy_file",
                        lambda path, name, folder, mode: order.append(name)
                        or copy(path, name, folder, mode))
    share_reference_builds(cfg)
    assert order.index("__grp__k.json") > order.index("k.cubin")


def test_a_missing_cache_shares_nothing(tmp_path: Path) -> None:
    assert share_reference_builds(_config(tmp_path)) == 0


# After the baseline, the offline strategy's compile:default candidate finds the graph
# built: it fails unless inductor's graph cache answered its compile.
_HIT_CHECK = '''

import torch._dynamo.utils as _dynamo_utils

_Rendered = ModelNew


class ModelNew(_Rendered):
    def forward(self, *args):
        out = super().forward(*args)
        counts = _dynamo_utils.counters["inductor"]
        if not counts["fxgraph_cache_hit"]:
            raise RuntimeError(f"the graph was built again: {dict(counts)}")
        return out
'''


@pytest.mark.slow
def test_a_compile_candidate_loads_the_baselines_build(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # inductor's CPU kernels are built for the process's thread count, which follows the
    # cores each child is pinned to (a GPU's Triton kernels are not): one for both here
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = _config(tmp_path)  # a cache of its own: no earlier test's build to find
    baseline = measure_baselines(mlp_task, cfg, modes=["eager", "compile:default"])
    assert all(m.stats is not None for m in baseline.modes), baseline.modes
    assert any((build_cache_root(cfg, "candidate") / "inductor").rglob("*"))
    verdict = evaluate(mlp_task, render(mlp_task.source, ("compile:default",)) + _HIT_CHECK,
                       cfg.model_copy(update={"time_candidate": False}))
    assert verdict.ok, verdict.message


def test_a_failed_share_never_fails_the_baseline(
        mlp_task: Task, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    from pike.evaluate import baseline as baseline_module
    from pike.evaluate.verdict import TimingStats

    stats = TimingStats.from_samples([1.0, 1.1])
    modes = [baseline_module.ModeTiming(mode="eager", stats=stats),
             baseline_module.ModeTiming(mode="compile:default", stats=stats)]

    class Closed:
        env: dict[str, str] = {}

    monkeypatch.setattr(baseline_module, "_measure_modes",
                        lambda *a, **k: (modes, Closed(), None))

    def share(cfg: EvalConfig, since: float | None = None) -> int:
        raise PermissionError(13, "Permission denied", "ccode.py")

    monkeypatch.setattr(baseline_module, "share_reference_builds", share)
    baseline = measure_baselines(mlp_task, _config(tmp_path), modes=["eager", "compile:default"])
    assert [m.mode for m in baseline.modes] == ["eager", "compile:default"]
    assert "not shared with the candidates" in caplog.text
