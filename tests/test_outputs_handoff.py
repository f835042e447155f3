"""Trial outputs handed over in a GPU buffer the parent lends the child (CUDA IPC): the
layout checks and the parent's protocol on CPU, the handoff itself on a GPU."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from pike.config import EvalConfig
from pike.evaluate import judge, outputs_handoff, trial_comparison
from pike.evaluate.leaf_files import LeafFileError, layout_of, write_leaves
from pike.evaluate.outputs_handoff import OutputsBuffer, OutputsSlot, leaves_from, write_into
from pike.task import Task
from tests.conftest import candidate

CPU = torch.device("cpu")


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        else:
            assert x == y


def test_leaves_written_into_a_buffer_come_back_as_they_were() -> None:
    leaves = [torch.randn(5, 7), torch.arange(3, dtype=torch.int64), 2.5, float("inf"),
              torch.ones(0, 4), torch.randn(4, 3).t(), "name", None,
              torch.randn(6, dtype=torch.complex64).conj(), torch.ones(3, dtype=torch.bfloat16)]
    entries, body = layout_of(leaves)
    buffer = torch.full((body + 128,), 0xAB, dtype=torch.uint8)
    write_into(buffer, leaves, entries)
    back = leaves_from(buffer, entries, CPU)
    _same([x.resolve_conj() if isinstance(x, torch.Tensor) else x for x in leaves], back)
    buffer.fill_(0)  # copied out: the child's next write changes nothing taken
    _same([x.resolve_conj() if isinstance(x, torch.Tensor) else x for x in leaves], back)


@pytest.mark.parametrize("forged, why", [
    ("not a list", "no list"),
    ([{"dtype": "float32", "shape": [4], "offset": 64, "nbytes": 16}], "does not fit"),
    ([{"dtype": "float32", "shape": [8], "offset": 0, "nbytes": 32},
      {"dtype": "float32", "shape": [8], "offset": 0, "nbytes": 32}], "overlap"),
    ([{"dtype": "float32", "shape": [4], "offset": 1, "nbytes": 16}], "does not fit"),
    ([{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 12}], "does not fit"),
    ([{"dtype": "bits8", "shape": [4], "offset": 0, "nbytes": 4}], "unknown dtype"),
    ([{"dtype": "float32", "shape": [-4], "offset": 0, "nbytes": 16}], "bad shape"),
    ([{"value": [1, 2]}], "not a scalar"),
    ([{"value": 1}] * (outputs_handoff._MAX_LEAVES + 1), "more than"),
])
def test_a_layout_that_does_not_fit_the_buffer_is_refused(forged: Any, why: str) -> None:
    """The child says where its leaves lie: nothing outside the lent bytes, no two leaves
    over the same bytes, only plain dtypes and JSON scalars."""
    with pytest.raises(LeafFileError, match=why):
        leaves_from(torch.zeros(64, dtype=torch.uint8), forged, CPU)


def test_no_buffer_is_lent_where_the_parent_compares_on_the_host() -> None:
    assert OutputsBuffer.offer([[torch.ones(4)]], CPU) is None


@pytest.mark.parametrize("offer", [None, "x", {}, {"handle": "zz", "bytes": 8},
                                   {"handle": "ab" * 63, "bytes": 8},
                                   {"handle": "ab" * 64, "bytes": -1}])
def test_a_child_offered_no_usable_buffer_writes_its_files(offer: Any) -> None:
    assert OutputsSlot.open(offer, torch.device("cuda")) is None
    assert OutputsSlot.open({"handle": "ab" * 64, "bytes": 8}, CPU) is None


class _FakeBuffer:
    """A lent buffer without the GPU: the bytes, and what was taken from them."""

    def __init__(self, nbytes: int) -> None:
        self.bytes = torch.zeros(nbytes, dtype=torch.uint8)
        self.taken: list[Any] = []
        self.handed = 0

    def take(self, entries: Any, to: torch.device) -> list[Any]:
        self.taken.append(entries)
        return leaves_from(self.bytes, entries, to)

    def close(self) -> None:
        pass


def _comparison(tmp_path: Path, trials: int = 2) -> tuple[trial_comparison.TrialComparison, list]:
    expected = [[torch.full((4,), float(t))] for t in range(trials)]
    comparison = trial_comparison.TrialComparison(expected, tmp_path, EvalConfig(trials=trials),
                                                  CPU)
    return comparison, expected


def test_a_trial_said_to_be_in_the_buffer_is_read_there_and_its_file_ignored(
        tmp_path: Path) -> None:
    comparison, expected = _comparison(tmp_path)
    fake = _FakeBuffer(256)
    comparison.buffer = fake  # type: ignore[assignment]
    for t, leaves in enumerate(expected):
        entries, _ = layout_of(leaves)
        write_into(fake.bytes, leaves, entries)
        write_leaves([torch.full((4,), 99.0)], tmp_path / f"outputs_{t}.pt")  # wrong: unread
        comparison.add(t, entries)
    assert len(fake.taken) == 2
    assert comparison.verdict().ok


def test_a_layout_the_buffer_cannot_hold_fails_the_trial_unread(tmp_path: Path) -> None:
    comparison, expected = _comparison(tmp_path)
    comparison.buffer = _FakeBuffer(64)  # type: ignore[assignment]
    comparison.add(0, [{"dtype": "float32", "shape": [1 << 20], "offset": 0,
                        "nbytes": 4 << 20}])
    verdict = comparison.verdict()
    assert verdict.status == "incorrect" and "could not be read back" in verdict.message


def test_a_layout_with_no_buffer_lent_reads_the_file(tmp_path: Path) -> None:
    """A child may say its outputs are in a buffer it was never lent: the file counts."""
    comparison, expected = _comparison(tmp_path, trials=1)
    write_leaves(expected[0], tmp_path / "outputs_0.pt")
    comparison.add(0, layout_of(expected[0])[0])
    assert comparison.verdict().ok


class _FakeChild:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def send(self, event: str, **fields: Any) -> None:
        self.sent.append((event, fields))

    def not_its_time(self, seconds: float) -> None:
        pass


def _early(comparison: trial_comparison.TrialComparison, child: _FakeChild) -> Any:
    compare = trial_comparison.compare_early(comparison, child, "cpu",  # type: ignore[arg-type]
                                   EvalConfig(trials=2, device_lock="pause_others"))
    assert compare is not None
    return compare


@pytest.mark.parametrize("trial", [0, 7, -1])
def test_the_child_hears_taken_for_every_trial_in_the_buffer_even_one_refused(
        tmp_path: Path, trial: int) -> None:
    """Else it would wait for its limit: a trial out of range or a layout refused is
    answered too, once, and the verdict still fails what could not be read."""
    comparison, _ = _comparison(tmp_path)
    comparison.buffer = _FakeBuffer(64)  # type: ignore[assignment]
    child = _FakeChild()
    compare = _early(comparison, child)
    compare(trial, [{"dtype": "float32", "shape": [1 << 20], "offset": 0, "nbytes": 4 << 20}])
    assert child.sent == [("taken", {"trial": trial})]
    compare(1, None)  # a file: nothing to answer
    assert len(child.sent) == 1


def test_the_child_may_write_its_next_trial_before_this_one_is_compared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """"taken" follows the copy, not the comparison: a comparison on the host takes
    seconds a gigabyte, and the child's check limit would pay for it."""
    comparison, expected = _comparison(tmp_path)
    fake = _FakeBuffer(256)
    comparison.buffer = fake  # type: ignore[assignment]
    child = _FakeChild()
    compare = _early(comparison, child)
    told_when_compared: list[int] = []
    real = trial_comparison.compare_with_room

    def compare_with_room(*args: Any, **kwargs: Any) -> Any:
        told_when_compared.append(len(child.sent))
        return real(*args, **kwargs)

    monkeypatch.setattr(trial_comparison, "compare_with_room", compare_with_room)
    for t, leaves in enumerate(expected):
        entries, _ = layout_of(leaves)
        write_into(fake.bytes, leaves, entries)
        compare(t, entries)
    assert told_when_compared == [1, 2]
    assert child.sent == [("taken", {"trial": 0}), ("taken", {"trial": 1})]
    assert comparison.verdict().ok


def test_a_child_told_anything_but_taken_stops_its_trials() -> None:
    from pike.evaluate.candidate_role import _wait_taken
    from pike.evaluate.child_setup import Failure

    class Chan:
        def __init__(self, reply: Any) -> None:
            self.reply = reply

        def receive(self) -> Any:
            return self.reply

    _wait_taken(Chan({"event": "taken", "trial": 0}), 0)  # type: ignore[arg-type]
    for reply in (None, {"event": "stop"}, {"event": "taken", "trial": 1}):
        with pytest.raises(Failure, match="did not take"):
            _wait_taken(Chan(reply), 0)  # type: ignore[arg-type]


def test_a_buffer_is_lent_in_whole_units_of_the_drivers_blocks() -> None:
    unit = outputs_handoff._UNIT
    assert [outputs_handoff._rounded(n) for n in (1, unit, unit + 1)] == [unit, unit, 2 * unit]


# --- on a GPU: the handoff itself, through the OS sandbox where it runs -----------------

_BIG_TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Outputs twice the size of its input: most of a trial is moving them."""

        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.cat([x * 2, torch.relu(x)], dim=1), x.sum()


    def get_inputs():
        return [torch.randn(64, 1 << 16)]


    def get_init_inputs():
        return []
''')

_LIES_ABOUT_ITS_LAYOUT = _BIG_TASK.replace("class Model(", '''
import sys

_handoff = sys.modules["pike.evaluate.outputs_handoff"]  # loaded by the runner before this
_put = _handoff.OutputsSlot.put


def _lying_put(self, leaves, trial, wait_taken):
    entries = _put(self, leaves, trial, wait_taken)
    if entries:
        entries[0]["offset"] = self.nbytes * 4 // 64 * 64  # past the buffer's end
    return entries


_handoff.OutputsSlot.put = _lying_put


class ModelNew(''', 1).replace("class Model(nn.Module)", "class ModelNew(nn.Module)")


@pytest.mark.gpu
def test_a_lent_buffer_holds_nothing_this_process_freed_there_before() -> None:
    """Fresh driver memory keeps what was last in it: the expected outputs' chunks a
    comparison copied and freed could otherwise reach the next candidate."""
    on = torch.device("cuda")
    secret = torch.full((64 << 20,), 0x5A, dtype=torch.uint8, device=on)
    del secret
    torch.cuda.empty_cache()
    buffer = OutputsBuffer.offer([[torch.ones(8 << 20, device=on)]], on)
    assert buffer is not None
    try:
        assert buffer.nbytes % outputs_handoff._UNIT == 0
        assert int(buffer._bytes.count_nonzero()) == 0
    finally:
        buffer.close()


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    handed: list[int] = []
    real_close = OutputsBuffer.close

    def close(self: OutputsBuffer) -> None:
        handed.append(self.handed)
        real_close(self)

    monkeypatch.setattr(OutputsBuffer, "close", close)
    return handed


def _big_task(tmp_path: Path) -> Task:
    path = tmp_path / "1_BigOutputs.py"
    path.write_text(_BIG_TASK)
    return Task.from_file(path)


@pytest.mark.gpu
def test_a_candidates_trials_reach_the_parent_in_gpu_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_config: EvalConfig) -> None:
    handed = _spied(monkeypatch)
    cfg = fast_config.model_copy(update={"device": "cuda", "device_lock": "pause_others"})
    task = _big_task(tmp_path)
    own = _BIG_TASK.replace("class Model(nn.Module)", "class ModelNew(nn.Module)")
    verdict = judge.evaluate(task, own, cfg)
    assert verdict.ok, verdict.message
    assert handed == [cfg.trials + cfg.guards]  # every trial, through the buffer
    wrong = own.replace("x * 2", "x * 3")
    verdict = judge.evaluate(task, wrong, cfg)
    assert verdict.status == "incorrect" and "trials failed" in verdict.message
    assert handed[-1] == cfg.trials + cfg.guards


@pytest.mark.gpu
def test_a_child_that_lies_about_its_layout_fails_and_harms_nothing_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_config: EvalConfig) -> None:
    """Leaves said to lie past the lent bytes are refused unread; the expected outputs the
    parent keeps on the GPU stay as they were for the next candidate."""
    _spied(monkeypatch)
    # guards off: they now reject the patch of OutputsSlot (a child class) before it
    # runs, and this is the parent's own defence, whatever the child's state
    cfg = fast_config.model_copy(update={"device": "cuda", "device_lock": "pause_others",
                                         "guards": False})
    task = _big_task(tmp_path)
    verdict = judge.evaluate(task, _LIES_ABOUT_ITS_LAYOUT, cfg)
    assert verdict.status == "incorrect" and "could not be read back" in verdict.message
    own = _BIG_TASK.replace("class Model(nn.Module)", "class ModelNew(nn.Module)")
    assert judge.evaluate(task, own, cfg).ok


@pytest.mark.gpu
def test_a_child_writing_its_buffer_after_the_trials_reaches_no_later_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_config: EvalConfig) -> None:
    """A thread of the candidate keeps writing the lent buffer for its whole life, timing
    included: the next candidates' buffers (often at the same address) and the kept
    expected outputs never see those writes. (The buffer is freed once the child has
    ended, so this does not show writes after a free.)"""
    handed = _spied(monkeypatch)
    # guards off: they now reject the patch of OutputsSlot (a child class) before it
    # runs, and this is the parent's own defence, whatever the child's state
    cfg = fast_config.model_copy(update={"device": "cuda", "device_lock": "pause_others",
                                         "guards": False})
    task = _big_task(tmp_path)
    scribbler = _BIG_TASK.replace("class Model(", '''
import sys, threading, time

_handoff = sys.modules["pike.evaluate.outputs_handoff"]

_put = _handoff.OutputsSlot.put
_started = []


def _scribble(slot):
    while True:
        slot.bytes.fill_(0xFF)
        torch.cuda.synchronize()
        time.sleep(0.001)


def _put_and_scribble(self, leaves, trial, wait_taken):
    entries = _put(self, leaves, trial, wait_taken)
    if not _started:  # from the first trial handed over on, for the child's whole life
        _started.append(threading.Thread(target=_scribble, args=(self,), daemon=True))
        _started[0].start()
    return entries


_handoff.OutputsSlot.put = _put_and_scribble


class ModelNew(''', 1).replace("class Model(nn.Module)", "class ModelNew(nn.Module)")
    judge.evaluate(task, scribbler, cfg)  # its own verdict: whatever its writes left
    assert handed and handed[0] >= 1  # it wrote trials into the buffer, so it scribbled
    own = _BIG_TASK.replace("class Model(nn.Module)", "class ModelNew(nn.Module)")
    for _ in range(2):
        verdict = judge.evaluate(task, own, cfg)
        assert verdict.ok, verdict.message
    assert handed[-1] == cfg.trials + cfg.guards


@pytest.mark.gpu
def test_the_example_mlp_is_judged_the_same_with_the_handoff(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _spied(monkeypatch)
    cfg = fast_config.model_copy(update={"device": "cuda", "device_lock": "pause_others"})
    assert judge.evaluate(mlp_task, candidate("fused"), cfg).ok
    assert judge.evaluate(mlp_task, candidate("cached"), cfg).status != "ok"
    assert handed and all(n >= 1 for n in handed)
