"""The cuts in an evaluation's cost keep its verdicts: outputs compared in chunks give the
same counts and errors as compared whole, inputs drawn on the device fall back to the host
where get_inputs() cannot run there, and the evaluator's files go where they are fastest
without leaving a user's choice aside."""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from pike.evaluate import check, child_setup, leftovers
from pike.evaluate.protocol import ChildRequest


def _outputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    expected = torch.randn(5, 41)
    actual = expected + 1e-6 * torch.randn(5, 41)
    actual[0, 3] += 0.5  # a wrong value in the first chunk
    actual[4, 40] = math.nan  # a NaN where the reference has none, in the last
    expected[2, 7] = actual[2, 7] = math.inf  # the same Inf: agreed
    expected[3, 1], actual[3, 1] = math.inf, -math.inf  # Inf of the other sign
    actual[1, 30] *= 1.5
    return expected, actual


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64])
def test_outputs_compared_in_chunks_match_the_whole_comparison(
        monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    expected, actual = _outputs()
    if dtype == torch.int64:
        expected, actual = (expected.nan_to_num(0, 0, 0) * 100).to(dtype), (
            actual.nan_to_num(0, 0, 0) * 100).to(dtype)
    elif dtype == torch.complex64:
        expected, actual = torch.complex(expected, expected), torch.complex(actual, actual)
    whole = check.compare_leaf(expected, actual, 0, 0, 1e-4, 1e-4)
    monkeypatch.setattr(check, "COMPARE_CHUNK", 7)  # 205 values in 30 chunks
    chunked = check.compare_leaf(expected, actual, 0, 0, 1e-4, 1e-4)
    assert chunked.model_dump() == whole.model_dump()
    assert chunked.problem and chunked.mismatched and chunked.mismatched >= 3


def test_a_finite_check_in_chunks_finds_one_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "COMPARE_CHUNK", 4)
    values = torch.zeros(50)
    assert check.all_finite([values, 3, torch.arange(5)])
    values[47] = math.inf
    assert not check.all_finite([torch.zeros(3), values])


def test_inputs_drawn_on_the_device_fall_back_to_the_host_where_they_cannot_be() -> None:
    def get_inputs() -> list[torch.Tensor]:
        # .numpy() works only on the host: on another device this get_inputs() raises
        return [torch.from_numpy(torch.rand(4, 3).numpy())]

    module = types.SimpleNamespace(get_inputs=get_inputs)
    request: ChildRequest = types.SimpleNamespace(module_path="task.py")  # type: ignore[assignment]
    drawn = child_setup._draw_inputs(module, request, 7, torch.device("meta"))
    again = child_setup._draw_inputs(module, request, 7)
    assert drawn[0].device.type == "cpu" and torch.equal(drawn[0], again[0])

    def on_any_device() -> list[torch.Tensor]:
        return [torch.rand(4, 3)]

    module.get_inputs = on_any_device
    assert child_setup._draw_inputs(module, request, 7, torch.device("meta"))[0].is_meta


@pytest.fixture
def fresh_scratch(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    leftovers.scratch_root.cache_clear()
    monkeypatch.delenv("PIKE_SCRATCH", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)
    yield
    leftovers.scratch_root.cache_clear()


def test_scratch_goes_to_memory_only_with_room_and_no_choice_made(
        fresh_scratch: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(leftovers, "_roomy_tmpfs", lambda path: True)
    assert leftovers.scratch_root() == Path("/dev/shm")
    leftovers.scratch_root.cache_clear()
    monkeypatch.setattr(leftovers, "_roomy_tmpfs", lambda path: False)
    assert leftovers.scratch_root() != Path("/dev/shm")
    leftovers.scratch_root.cache_clear()
    monkeypatch.setattr(leftovers, "_roomy_tmpfs", lambda path: True)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # a user's TMPDIR is kept
    assert leftovers.scratch_root() != Path("/dev/shm")
    leftovers.scratch_root.cache_clear()
    monkeypatch.setenv("PIKE_SCRATCH", str(tmp_path / "here"))
    assert leftovers.scratch_root() == tmp_path / "here"


def test_a_small_or_full_tmpfs_is_not_roomy(monkeypatch: pytest.MonkeyPatch) -> None:
    def statvfs(free_gib: float, size_gib: float):  # type: ignore[no-untyped-def]
        block = 4096
        return lambda path: types.SimpleNamespace(
            f_bavail=int(free_gib * 2**30 / block), f_frsize=block,
            f_blocks=int(size_gib * 2**30 / block))

    monkeypatch.setattr(leftovers.os, "access", lambda path, mode: True)
    monkeypatch.setattr(leftovers.os, "statvfs", statvfs(60, 64))
    assert leftovers._roomy_tmpfs(Path("/dev/shm"))
    monkeypatch.setattr(leftovers.os, "statvfs", statvfs(4, 64))  # under 8 GiB free
    assert not leftovers._roomy_tmpfs(Path("/dev/shm"))
    monkeypatch.setattr(leftovers.os, "statvfs", statvfs(10, 64))  # under a quarter free
    assert not leftovers._roomy_tmpfs(Path("/dev/shm"))


# ---- a GPU with no room left for the parent's comparison ----------------------------------


@pytest.mark.parametrize("short_of_room", ["reading", "comparing"])
def test_a_comparison_without_room_on_the_gpu_is_made_on_the_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_of_room: str) -> None:
    """Other evaluations' memory on a shared GPU is not the candidate's fault: a correct
    candidate whose outputs the parent cannot fit on the GPU is compared on the host, and
    stays correct (on an H200 with 16 evaluations at once it was judged `incorrect`)."""
    from pike.config import EvalConfig
    from pike.evaluate import trial_comparison
    from pike.evaluate.leaf_files import write_leaves

    expected = [[torch.full((4, 3), float(t))] for t in range(2)]
    for t, leaves in enumerate(expected):
        write_leaves(leaves, tmp_path / f"outputs_{t}.pt")
    gpu = torch.device("cuda")
    real_load, real_compare = trial_comparison.load_leaves, trial_comparison._compare_leaves
    tried_on: list[str] = []

    def load(path: Path, mapped: bool = False, on: torch.device | None = None,
             like: list | None = None) -> list:
        tried_on.append(f"read on {on.type if on else None}")
        if on == gpu and short_of_room == "reading":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 MiB.")
        return real_load(path, mapped, None, like)  # no GPU here: the bytes land on the host

    def compare(exp: list, act: list, trial: int, cfg: EvalConfig, on: torch.device,
                atol: float | list[float] | None = None) -> list:
        tried_on.append(f"compare on {on.type}")
        if on == gpu:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 498.00 MiB.")
        return real_compare(exp, act, trial, cfg, on, atol)

    monkeypatch.setattr(trial_comparison, "load_leaves", load)
    monkeypatch.setattr(trial_comparison, "_compare_leaves", compare)
    verdict = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=2),
                                               gpu).verdict()
    assert verdict.status == "ok", verdict.message
    assert verdict.trials_passed == 2
    assert tried_on[:3] == (["read on cuda", "read on cpu", "compare on cpu"]
                            if short_of_room == "reading" else
                            ["read on cuda", "compare on cuda", "compare on cpu"])

    # a candidate's wrong values are still wrong when compared on the host
    write_leaves([torch.zeros(4, 3)], tmp_path / "outputs_1.pt")
    assert trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=2),
                                            gpu).verdict().status == "incorrect"


def _trials(tmp_path: Path, count: int) -> list[list[torch.Tensor]]:
    from pike.evaluate.leaf_files import write_leaves

    expected = [[torch.full((4, 3), float(t) + 0.5)] for t in range(count)]
    for t, leaves in enumerate(expected):
        write_leaves(leaves, tmp_path / f"outputs_{t}.pt")
    return expected


def test_trials_compared_as_the_child_saves_them_are_each_compared_once_and_all_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's word that a trial is saved only decides when the parent looks: out of
    order, repeated, or never said, every trial is compared once, in order, and judged."""
    from pike.config import EvalConfig
    from pike.evaluate import trial_comparison

    expected = _trials(tmp_path, 4)
    compared: list[int] = []
    real = trial_comparison.compare_with_room

    def counted(exp: list, act: list, trial: int, *rest: Any) -> list:
        compared.append(trial)
        return real(exp, act, trial, *rest)

    monkeypatch.setattr(trial_comparison, "compare_with_room", counted)
    comparison = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=3),
                                                  torch.device("cpu"))
    comparison.add(1)
    assert compared == [0, 1]  # the first trial's fingerprint comes first
    comparison.add(1)
    comparison.add(0)
    assert compared == [0, 1]
    verdict = comparison.verdict()  # trials 2 and 3 (the shifted one) were never said
    assert compared == [0, 1, 2, 3]
    assert verdict.status == "ok" and verdict.trials_passed == 3

    # a wrong trial compared early is still named; a cached answer is still called one
    from pike.evaluate.leaf_files import write_leaves
    for t in range(4):
        write_leaves(expected[0], tmp_path / f"outputs_{t}.pt")
    comparison = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=3),
                                                  torch.device("cpu"))
    comparison.add(2)
    verdict = comparison.verdict()
    assert verdict.status == "incorrect" and "trial 1" in verdict.message
    assert "identical for different inputs" in verdict.message


def test_an_unreadable_trial_ends_the_comparison(tmp_path: Path) -> None:
    from pike.config import EvalConfig
    from pike.evaluate import trial_comparison

    expected = _trials(tmp_path, 3)
    (tmp_path / "outputs_1.pt").write_bytes(b"not a tensor file")
    comparison = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=2),
                                                  torch.device("cpu"))
    comparison.add(2)
    verdict = comparison.verdict()
    assert verdict.status == "incorrect" and "trial 1: outputs could not be read back" in \
        verdict.message


def test_the_parent_compares_a_trial_while_the_child_runs_the_next(
        monkeypatch: pytest.MonkeyPatch, fast_config: Any, mlp_task: Any) -> None:
    """With pausing (the default), a candidate's trial is compared when its child says it
    is saved, before the child's trials end; the verdict is the same."""
    from pike.evaluate import driver, judge, trial_comparison
    from tests.conftest import candidate

    seen: list[tuple[int, bool]] = []
    real_add = trial_comparison.TrialComparison.add
    checked = {"done": False}
    real_pump = driver._pump

    def add(self: Any, trial: int, layout: Any = None) -> None:
        seen.append((trial, checked["done"]))
        real_add(self, trial, layout)

    def pump(child: Any, report: Any, until: str, on_saved: Any = None) -> bool:
        ran = real_pump(child, report, until, on_saved)
        if child.request.role == "candidate" and until == "checked":
            checked["done"] = True
        return ran

    monkeypatch.setattr(trial_comparison.TrialComparison, "add", add)
    monkeypatch.setattr(driver, "_pump", pump)
    verdict = judge.evaluate(mlp_task, candidate("fused"),
                             fast_config.model_copy(update={"device_lock": "pause_others"}))
    assert verdict.ok, verdict.message
    early = [t for t, after_checked in seen if not after_checked]
    assert early[:2] == [0, 1], seen  # said by the child while its trials ran


def test_a_read_trial_file_is_passed_on_to_a_later_trial_never_over_one_begun(
        tmp_path: Path) -> None:
    """Once read, trial t's file becomes the first later one the child has not begun (from
    t+2, the check after timing's last), for the child to write over in place; a file the
    child has begun is never replaced, and a file with nowhere to go is removed."""
    from pike.config import EvalConfig
    from pike.evaluate import trial_comparison
    from pike.evaluate.leaf_files import write_leaves

    expected = _trials(tmp_path, 4)  # three trials and the shifted one
    inodes = {t: (tmp_path / f"outputs_{t}.pt").stat().st_ino for t in range(4)}
    (tmp_path / "outputs_2.pt").unlink()  # the child has not reached trial 2 yet
    (tmp_path / "outputs_3.pt").write_bytes(b"begun")  # but has begun trial 3
    comparison = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=3),
                                                  torch.device("cpu"))
    comparison.add(1)
    assert not (tmp_path / "outputs_0.pt").exists() and not (tmp_path / "outputs_1.pt").exists()
    assert (tmp_path / "outputs_2.pt").stat().st_ino == inodes[0]
    assert (tmp_path / "outputs_3.pt").read_bytes() == b"begun"
    assert (tmp_path / "outputs_final.pt").stat().st_ino == inodes[1]  # 3 was begun

    write_leaves(expected[2], tmp_path / "outputs_2.pt", in_place=True)
    write_leaves(expected[3], tmp_path / "outputs_3.pt", in_place=True)
    verdict = comparison.verdict()
    assert verdict.status == "ok" and verdict.trials_passed == 3, verdict.message
    assert (tmp_path / "outputs_final.pt").stat().st_ino == inodes[1]  # kept for it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs_final.pt"]


def test_a_passed_on_file_the_child_does_not_write_over_fails_its_trial(
        tmp_path: Path) -> None:
    """A child that says it saved a trial without writing it leaves the earlier trial's
    outputs in the passed-on file: they are judged against the new trial's expected
    outputs, as a missing file would be, and never pass."""
    from pike.config import EvalConfig
    from pike.evaluate import trial_comparison

    expected = _trials(tmp_path, 4)
    for t in (2, 3):
        (tmp_path / f"outputs_{t}.pt").unlink()
    comparison = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=3),
                                                  torch.device("cpu"))
    comparison.add(1)  # trial 0's file is now trial 2's, trial 1's trial 3's
    verdict = comparison.verdict()
    assert verdict.status == "incorrect"
    assert {m.trial for m in verdict.mismatches} == {2, 3}


def test_the_candidate_child_writes_its_trials_over_the_files_passed_on(
        monkeypatch: pytest.MonkeyPatch, fast_config: Any, mlp_task: Any) -> None:
    """End to end: the last trials' files are passed on (the check after timing always
    gets one: it is written long after the trials are compared) and the verdict, its
    check after timing included, is the same."""
    import os

    from pike.evaluate import judge
    from tests.conftest import candidate

    passed_on: list[str] = []
    real_link = os.link

    def link(src: Any, dst: Any, **kwargs: Any) -> None:
        real_link(src, dst, **kwargs)
        passed_on.append(Path(dst).name)

    monkeypatch.setattr(os, "link", link)
    verdict = judge.evaluate(mlp_task, candidate("fused"),
                             fast_config.model_copy(update={"device_lock": "pause_others"}))
    assert verdict.ok, verdict.message
    assert "outputs_final.pt" in passed_on, passed_on


def test_outputs_linked_to_the_expected_ones_are_refused_not_compared(tmp_path: Path) -> None:
    """A child that links its outputs file to the parent's own expected outputs (which a
    reader following links would compare with themselves) gets `incorrect`."""
    from pike.config import EvalConfig
    from pike.evaluate import trial_comparison
    from pike.evaluate.leaf_files import write_leaves

    expected = _trials(tmp_path, 3)
    answers = tmp_path / "expected_0.pt"
    write_leaves(expected[0], answers)
    (tmp_path / "outputs_0.pt").unlink()
    (tmp_path / "outputs_0.pt").symlink_to(answers)
    verdict = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=2),
                                               torch.device("cpu")).verdict()
    assert verdict.status == "incorrect"
    assert "trial 0: outputs could not be read back (the file is a symbolic link)" in \
        verdict.message
