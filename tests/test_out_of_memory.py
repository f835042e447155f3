"""A GPU crowded by other evaluations: a reference or a confirming window that ran out of
its memory runs once more instead of failing its task or losing its figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from pike.config import EvalConfig, RunConfig
from pike.errors import TaskError
from pike.evaluate import confirm as confirming
from pike.evaluate import reference, reference_cache, reference_start
from pike.evaluate.confirm import Confirmation
from pike.evaluate.verdict import TimingStats, Verdict, says_out_of_memory
from pike.search.confirm_best import confirm_best
from pike.store import RunStore
from pike.task import Task

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.97 GiB. GPU 0 has "
       "a total capacity of 79.18 GiB of which 54.50 MiB is free.")


def test_the_words_of_an_out_of_memory_failure_are_recognised() -> None:
    assert says_out_of_memory(OOM)
    assert says_out_of_memory("RuntimeError: CUDA error: out of memory")
    assert not says_out_of_memory("exited with status 1 during phase 'setup'")
    assert not says_out_of_memory(None)


# the words of CUDA's libraries when their workspace finds no room (the first from a level2
# reference beside 15 other evaluations on an H200)
@pytest.mark.parametrize("message", [
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "RuntimeError: cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate`",
    "RuntimeError: cuFFT error: CUFFT_ALLOC_FAILED",
])
def test_a_cuda_library_that_cannot_allocate_says_out_of_memory(message: str) -> None:
    assert says_out_of_memory(message)


@pytest.mark.parametrize("message", [
    "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`",
    "RuntimeError: cuDNN error: CUDNN_STATUS_BAD_PARAM",
    "ValueError: MYLIB_STATUS_ALLOC_FAILED",
])
def test_other_library_errors_are_not_out_of_memory(message: str) -> None:
    assert not says_out_of_memory(message)


@pytest.fixture()
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each reference attempt gives, in order (a failure Verdict or a run)."""
    answers: list[Any] = []
    calls: list[str] = []

    def attempt(task: Task, cfg: EvalConfig, device: str, keep_child: bool) -> Any:
        calls.append(device)
        return answers.pop(0)

    monkeypatch.setattr(reference_start, "_reference_attempt", attempt)
    monkeypatch.setattr(reference_cache, "_OUT_OF_MEMORY_WAIT_S", 0.0)
    answers_and_calls: list[Any] = [answers, calls]
    return answers_and_calls


def _failure(message: str) -> Verdict:
    return Verdict(status="runtime_error", phase="check", message=message)


def test_a_reference_out_of_gpu_memory_runs_once_more(mlp_task: Task,
                                                      attempts: list[Any]) -> None:
    answers, calls = attempts
    run = mock.Mock(spec=reference.ReferenceRun)
    answers += [_failure(OOM), run]
    assert reference_cache.run_reference(mlp_task, EvalConfig(), "cuda:0", keep_child=True, cache=False) is run
    assert calls == ["cuda:0", "cuda:0"]


def test_a_reference_out_of_gpu_memory_twice_fails_its_task(mlp_task: Task,
                                                            attempts: list[Any]) -> None:
    answers, calls = attempts
    answers += [_failure(OOM), _failure(OOM), mock.Mock(spec=reference.ReferenceRun)]
    with pytest.raises(TaskError, match="out of memory"):
        reference_cache.run_reference(mlp_task, EvalConfig(), "cuda:0", keep_child=True, cache=False)
    assert len(calls) == 2


@pytest.mark.parametrize(("device", "message"), [("cuda:0", "ZeroDivisionError: division by "
                                                  "zero"), ("cpu", OOM)])
def test_any_other_reference_failure_is_not_run_again(mlp_task: Task, attempts: list[Any],
                                                      device: str, message: str) -> None:
    answers, calls = attempts
    answers += [_failure(message), mock.Mock(spec=reference.ReferenceRun)]
    with pytest.raises(TaskError, match=message.split(":")[0]):
        reference_cache.run_reference(mlp_task, EvalConfig(), device, keep_child=True, cache=False)
    assert calls == [device]


def _store_with_candidates(task: Task, tmp_path: Path) -> tuple[RunStore, list[int]]:
    store = RunStore.create(tmp_path / "run", {}, "test")
    store.add_task(task.name, str(task.path), task.sha256, task.source)
    stats = TimingStats.from_samples([1.0])
    ids = []
    for speedup in (2.0, 1.9):
        cid = store.add_candidate(task.name, task.source, parent_id=None, role="optimize",
                                  round=0, branch=0)
        store.set_verdict(cid, Verdict(status="ok", runtime=stats, reference=stats,
                                       speedup=speedup))
        ids.append(cid)
    return store, ids


CRASH = ("exited with status 1 during phase 'check'\n:128: RuntimeWarning: "
         "'pike.evaluate.runner' found in sys.modules\nTraceback (most recent call last):")


@pytest.mark.parametrize(("first_error", "failing", "windows"), [
    (OOM, 0, 2), (OOM, 1, 2),
    # a crash of the faster candidate would change the best: a window more (on the H100
    # pike's own compile:default crashed there and a file half its speed became the best)
    (CRASH, 0, 2),
    # a crash below the confirmed best changes nothing: its failure stays its figure
    (CRASH, 1, 1),
])
def test_a_confirming_window_out_of_gpu_memory_is_timed_once_more(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, first_error: str, failing: int, windows: int
        ) -> None:
    store, ids = _store_with_candidates(mlp_task, tmp_path)  # 2.0x and 1.9x when searched
    timed: list[list[int]] = []
    other = ids[1 - failing]

    def window(task: Task, sources: dict[int, str], cfg: EvalConfig) -> list[Confirmation]:
        timed.append(sorted(sources))
        if len(timed) == 1:
            return [Confirmation(candidate_id=other, runtime_ms=1.0, reference_ms=1.5,
                                 speedup=1.5),
                    Confirmation(candidate_id=ids[failing], error=first_error)]
        return [Confirmation(candidate_id=i, runtime_ms=1.0, reference_ms=s, speedup=s)
                for i, s in zip(ids, (2.1, 1.8), strict=True)]

    monkeypatch.setattr(confirming, "confirm", window)
    cfg = RunConfig()
    cfg.search.confirm_top = 2
    with store:
        confirm_best(store, mlp_task, cfg)
        kept = store.get_state(mlp_task.name, "confirmed")
        best = store.best(mlp_task.name)
    assert timed == [sorted(ids)] * windows
    if windows == 2:  # the second window's figures, every candidate in it
        assert [f["speedup"] for f in kept["figures"]] == [2.1, 1.8]
        assert best is not None and best.id == ids[0]
    else:  # a failure of the candidate's own stays its figure
        assert kept["figures"][1]["error"] == first_error
        assert best is not None and best.id == ids[0]
    assert "failed in the confirming window" not in caplog.text or windows == 2


def _confirm_with(store: RunStore, task: Task, window: Any,
                  monkeypatch: pytest.MonkeyPatch) -> Any:
    """`confirm_best` of the two best candidates with `window` as the confirming window;
    the task's best afterwards."""
    monkeypatch.setattr(confirming, "confirm", window)
    cfg = RunConfig()
    cfg.search.confirm_top = 2
    with store:
        confirm_best(store, task, cfg)
        return store.best(task.name)


def test_a_faster_candidate_failing_both_windows_is_named_and_the_best_is_a_confirmed_one(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store, ids = _store_with_candidates(mlp_task, tmp_path)
    timed: list[int] = []

    def window(task: Task, sources: dict[int, str], cfg: EvalConfig) -> list[Confirmation]:
        timed.append(1)
        return [Confirmation(candidate_id=ids[1], runtime_ms=1.0, reference_ms=1.5,
                             speedup=1.5),
                Confirmation(candidate_id=ids[0], error=CRASH)]

    best = _confirm_with(store, mlp_task, window, monkeypatch)
    assert len(timed) == 2
    assert best is not None and best.id == ids[1] and best.verdict.confirmed
    assert (f"candidate {ids[0]} (2.00x in its search window) failed in the confirming "
            "window (exited with status 1 during phase 'check' ... Traceback (most recent "
            "call last):); the best is the fastest one confirmed") in caplog.text


def test_when_no_candidate_is_confirmed_the_warning_says_the_search_figures_stand(
        mlp_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store, ids = _store_with_candidates(mlp_task, tmp_path)

    def window(task: Task, sources: dict[int, str], cfg: EvalConfig) -> list[Confirmation]:
        return [Confirmation(candidate_id=ids[1], error="exited with status 1"),
                Confirmation(candidate_id=ids[0], error=CRASH)]  # the higher, named

    best = _confirm_with(store, mlp_task, window, monkeypatch)
    assert best is not None and not best.verdict.confirmed and best.id == ids[0]
    assert (f"candidate {ids[0]} (2.00x in its search window) failed in the confirming "
            "window") in caplog.text
    assert "no candidate was confirmed: the search's own figures stand" in caplog.text


def test_a_confirming_failure_keeps_the_line_that_names_the_error() -> None:
    # A child's message is its exit, its stderr's warnings and traceback, and last the
    # error: cut to its head, a GPU out of memory read as any crash and was not retried.
    noise = "RuntimeWarning: 'pike.evaluate.runner' found in sys.modules\n" * 10
    message = f"exited with status 1 during phase 'check'\n{noise}Traceback ...\n{OOM}"
    short = confirming._short(message)
    assert len(short) <= 300
    assert short.startswith("exited with status 1 during phase 'check'")
    assert says_out_of_memory(short)
    assert confirming._short("exited with status 1") == "exited with status 1"


def test_the_wait_before_the_second_reference_run_holds_no_lock(
        mlp_task: Task, attempts: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # Other tasks look up their own kept references under the cache's lock meanwhile.
    answers, calls = attempts
    run = mock.Mock(spec=reference.ReferenceRun)
    run.users = 0
    answers += [_failure(OOM), run]
    held_while_waiting: list[bool] = []

    def wait(seconds: float) -> None:
        held_while_waiting.append(reference_cache._references_lock.locked())

    monkeypatch.setattr(reference_cache, "_wait", wait)
    monkeypatch.setattr(reference_cache, "_references", type(reference_cache._references)())
    assert reference_cache.run_reference(mlp_task, EvalConfig(), "cuda:0", keep_child=True) is run
    assert held_while_waiting == [False] and len(calls) == 2


def test_a_reference_whose_cublas_handle_found_no_room_is_tried_again(
        mlp_task: Task, attempts: list[Any]) -> None:
    """As a reference out of the allocator's memory: run once more, not the task failed."""
    answers, calls = attempts
    run = mock.Mock(spec=reference.ReferenceRun)
    answers += [_failure("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                         "`cublasCreate(handle)`"), run]
    assert reference_cache.run_reference(mlp_task, EvalConfig(), "cuda:0", keep_child=True, cache=False) is run
    assert calls == ["cuda:0", "cuda:0"]

