"""The reference cache of a campaign: each task's reference made once, different tasks'
at once, outside the cache's lock; a failure is every waiting evaluation's; the wait
for host memory inside the making counted once."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pike.config import EvalConfig
from pike.errors import TaskError
from pike.evaluate import reference, reference_cache
from pike.evaluate.steps import current, measuring
from pike.evaluate.verdict import Verdict
from pike.task import Task


def _tasks(tmp_path: Path, *names: str) -> list[Task]:
    tasks = []
    for name in names:
        path = tmp_path / f"{name}.py"
        path.write_text(f"# {name}\nimport torch\n\n\nclass Model(torch.nn.Module):\n"
                        "    pass\n\n\ndef get_inputs():\n    return []\n\n\n"
                        "def get_init_inputs():\n    return []\n")
        tasks.append(Task.from_file(path))
    return tasks


def _run() -> Any:
    return types.SimpleNamespace(usable=lambda: True, users=0, close=lambda: None)


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    yield
    reference_cache._references.clear()
    reference_cache._making.clear()


def _in_threads(work: Callable[[], Any], count: int) -> list[Any]:
    got: list[Any] = []

    def one() -> None:
        try:
            got.append(work())
        except BaseException as err:  # noqa: BLE001 - what each caller saw
            got.append(err)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join(10)
    return got


def test_references_of_different_tasks_are_made_at_once_and_each_only_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made one after another under the cache's lock, the references of the eight tasks a
    resumed level2 bench took up again kept their first candidates waiting 100 s each on
    an H200; a task's own evaluations still share one."""
    tasks = _tasks(tmp_path, "1_A", "2_B")
    making: list[str] = []
    met: list[bool] = []
    overlapped = threading.Event()
    lock = threading.Lock()

    def start(task: Task, cfg: EvalConfig, device: str, keep_child: bool) -> Any:
        with lock:
            making.append(task.name)
            if len(making) == 2:
                overlapped.set()
        met.append(overlapped.wait(5))  # under one lock the other could not start meanwhile
        time.sleep(0.1)  # the task's second evaluation asks meanwhile
        return types.SimpleNamespace(usable=lambda: True, users=0, close=lambda: None)

    monkeypatch.setattr(reference_cache, "_start_reference", start)
    got: dict[str, list[Any]] = {t.name: [] for t in tasks}

    def evaluation(task: Task) -> None:
        got[task.name].append(reference_cache.run_reference(task, EvalConfig(), "cpu", keep_child=True))

    threads = [threading.Thread(target=evaluation, args=(t,)) for t in (*tasks, tasks[0])]
    try:
        for thread in threads:
            thread.start()
            time.sleep(0.02)
        for thread in threads:
            thread.join(10)
    finally:
        reference_cache._references.clear()
    assert met == [True, True]
    assert sorted(making) == ["1_A", "2_B"]  # the first task's second evaluation made none
    first, again = got["1_A"]
    assert first is again and first.users == 2


def test_a_failed_reference_is_the_failure_of_every_evaluation_waiting_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (task,) = _tasks(tmp_path, "1_A")
    attempts: list[str] = []

    def start(task: Task, cfg: EvalConfig, device: str, keep_child: bool) -> Any:
        attempts.append(task.name)
        time.sleep(0.2)  # the others ask meanwhile
        raise TaskError("reference failed: the task's own module raised")

    monkeypatch.setattr(reference_cache, "_start_reference", start)
    got = _in_threads(lambda: reference_cache.run_reference(task, EvalConfig(), "cpu", keep_child=True),
                      3)
    assert attempts == ["1_A"]  # made once, failed once: not once per waiting evaluation
    assert len(got) == 3 and all(isinstance(e, TaskError) for e in got)
    assert reference_cache._making == {}


def test_a_reference_whose_maker_was_interrupted_is_made_by_the_next_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (task,) = _tasks(tmp_path, "1_A")
    attempts: list[int] = []

    def start(task: Task, cfg: EvalConfig, device: str, keep_child: bool) -> Any:
        attempts.append(len(attempts))
        time.sleep(0.2)
        if len(attempts) == 1:
            raise KeyboardInterrupt  # its own evaluation unwinds; the task's others go on
        return _run()

    monkeypatch.setattr(reference_cache, "_start_reference", start)
    got = _in_threads(lambda: reference_cache.run_reference(task, EvalConfig(), "cpu", keep_child=True),
                      2)
    assert attempts == [0, 1]
    assert sum(isinstance(g, KeyboardInterrupt) for g in got) == 1
    assert sum(isinstance(g, types.SimpleNamespace) for g in got) == 1


def test_the_references_wait_for_memory_is_counted_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the asking evaluation's `reference` step, as `reference.wait_for_memory`: a
    budget that leaves out both `reference` and `wait_for_memory` counted it twice."""
    from pike.search.offline import _stood

    (task,) = _tasks(tmp_path, "1_A")

    def start(task: Task, cfg: EvalConfig, device: str, keep_child: bool) -> Any:
        current().add("wait_for_memory", 30.0)  # as child_launch.wait_for_room records it
        current().add("launch_child", 1.0)
        return _run()

    monkeypatch.setattr(reference_cache, "_start_reference", start)
    with measuring() as clock:
        with clock.span("reference"):
            reference_cache.run_reference(task, EvalConfig(), "cpu", keep_child=True)
        clock.add("reference", 31.0)  # the seconds the making took, as its span says
    assert "wait_for_memory" not in clock.spans
    assert clock.spans["reference.wait_for_memory"] == 30.0
    assert clock.spans["launch_child"] == 1.0
    verdict = Verdict(status="ok", steps=clock.rounded())
    assert _stood(verdict) == pytest.approx(clock.spans["reference"], abs=1e-3)


def test_a_child_waiting_for_memory_closes_the_least_recently_used_idle_reference() -> None:
    closed: list[str] = []

    def run(name: str, users: int) -> Any:
        return types.SimpleNamespace(users=users, close=lambda: closed.append(name))

    reference_cache._references.update({"busy": run("busy", 1), "old": run("old", 0),
                              "new": run("new", 0)})
    assert reference_cache._close_an_idle_reference() and closed == ["old"]
    assert reference_cache._close_an_idle_reference() and closed == ["old", "new"]
    assert not reference_cache._close_an_idle_reference()  # the one in use stays
    assert list(reference_cache._references) == ["busy"]


def test_a_counted_work_is_read_without_waiting_for_the_task_s_windows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task's work is counted once in the reference's child; after that, a verdict's
    floor reads it while another evaluation holds the reference (`talking`, as a timing
    window does), instead of waiting out that window with its lane held."""
    asked: list[str] = []

    def request(child: Any, kind: str, answer: str, phase: str, **_: Any) -> dict[str, Any]:
        asked.append(kind)
        return {"work": {"flops": 10, "bytes_min": 20}}

    monkeypatch.setattr(reference, "request", request)
    run = reference.ReferenceRun(inputs_dir=tmp_path, expected=[], env={},
                                 child=types.SimpleNamespace(enter_phase=lambda phase: None),
                                 _tmp=tmp_path)
    first = run.work()
    assert first is not None and first.flops == 10 and asked == ["work"]
    held, release = threading.Event(), threading.Event()

    def window() -> None:  # another evaluation's timing window of the same task
        with run.talking:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=window)
    holder.start()
    try:
        assert held.wait(10)
        read: list[Any] = []
        reader = threading.Thread(target=lambda: read.append(run.work()))
        reader.start()
        reader.join(5)
        assert not reader.is_alive(), "the floor waited for the window"
        assert read == [first] and asked == ["work"]  # counted once
    finally:
        release.set()
        holder.join()


def test_a_failed_work_count_is_not_asked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def request(child: Any, kind: str, answer: str, phase: str, **_: Any) -> dict[str, Any]:
        asked.append(kind)
        raise RuntimeError("the child went away")

    monkeypatch.setattr(reference, "request", request)
    run = reference.ReferenceRun(inputs_dir=tmp_path, expected=[], env={},
                                 child=types.SimpleNamespace(enter_phase=lambda phase: None),
                                 _tmp=tmp_path)
    with pytest.raises(RuntimeError):
        run.work()
    assert run.work() is None and asked == ["work"]


def test_idle_references_are_closed_by_device_and_task(tmp_path: Path) -> None:
    mla, llama, other = _tasks(tmp_path, "mla", "llama", "other")
    closed: list[str] = []

    def run(name: str, device: str, users: int = 0) -> Any:
        return types.SimpleNamespace(users=users, device=device,
                                     close=lambda: closed.append(name))

    reference_cache._references.update({
        f"{mla.sha256}|cuda:0|p|True": run("mla", "cuda:0"),
        f"{other.sha256}|cuda:0|p|True": run("other busy", "cuda:0", users=1),
        f"{other.sha256}|cuda:1|p|True": run("other on cuda:1", "cuda:1"),
        f"{llama.sha256}|cuda:0|p|True": run("llama", "cuda:0")})
    # a task whose audit ended: its own idle ones go, on any device, and no other's
    assert reference_cache.close_idle_references(of=other) == 1
    assert closed == ["other on cuda:1"]
    assert reference_cache.close_idle_references(of=other) == 0  # the busy one stays
    # every idle one on a device
    assert reference_cache.close_idle_references("cuda:0") == 2
    assert sorted(closed) == ["llama", "mla", "other on cuda:1"]
    assert len(reference_cache._references) == 1


def test_a_count_that_needs_the_gpu_waits_for_the_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The count beside a starting candidate asks for no GPU memory: level5's
    14_llama2_decode built a second copy of its model on the card there (its meta count
    failing), and its candidate's constructor ran out of memory."""
    asked: list[bool] = []

    def request(child: Any, kind: str, answer: str, phase: str,
                without_gpu: bool = False) -> dict[str, Any]:
        asked.append(without_gpu)
        if without_gpu:
            return {"work": None, "needs_device": True, "error": "not on the meta device"}
        return {"work": {"flops": 10, "bytes_min": 20}}

    monkeypatch.setattr(reference, "request", request)
    run = reference.ReferenceRun(inputs_dir=tmp_path, expected=[], env={},
                                 child=types.SimpleNamespace(enter_phase=lambda phase: None),
                                 _tmp=tmp_path)
    reference_cache.count_work_meanwhile(run)
    for _ in range(100):  # the background count's thread
        if asked and run.users == 0:
            break
        time.sleep(0.02)
    reference_cache.count_work_meanwhile(run)  # known to need the GPU: not asked again
    time.sleep(0.1)
    assert asked == [True] and run.work() is not None  # the floor's call counts it
    assert asked == [True, False]
    assert run.work().flops == 10 and asked == [True, False]  # once


def test_the_child_counts_on_the_meta_device_only_when_asked_without_the_gpu(
        tmp_path: Path) -> None:
    from pike.evaluate import child_serving

    task = tmp_path / "reads_values.py"
    task.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n"
                    "    def forward(self, x):\n        return x * float(x.sum())\n\n\n"
                    "def get_inputs():\n    return [torch.ones(4)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    sent: list[dict[str, Any]] = []
    chan = types.SimpleNamespace(send=lambda event, **fields: sent.append(fields))
    req = types.SimpleNamespace(construct_on="device", module_path=str(task), device="cpu",
                                seed=1)
    child_serving._serve_work(req, {"seq": "a", "without_gpu": True}, chan)
    assert sent[-1]["needs_device"] and sent[-1]["work"] is None
    child_serving._serve_work(req, {"seq": "b"}, chan)  # where the models are built
    assert sent[-1]["work"]["flops"] is not None and "needs_device" not in sent[-1]
    req.construct_on = "cpu"  # a count on the CPU needs no GPU: made at once
    child_serving._serve_work(req, {"seq": "c", "without_gpu": True}, chan)
    assert sent[-1]["work"] is not None
