"""The timed sets' outputs are computed again by the reference's live child when a
window's samples are checked, not kept from its check: only the positions sampled are
read, and kept they were half of a reference's files (28 of 56 GiB on level1's 7)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pike.config import EvalConfig
from pike.evaluate import candidate_windows, check, reference_cache
from pike.evaluate.leaf_files import read_leaves
from pike.evaluate.protocol import EXTRA_TRIALS, timed_set_count
from pike.evaluate.reference_role import _fingerprint
from pike.evaluate.timing_window import Timer
from pike.task import Task

_TASK = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0, x.sum(), 3


def get_inputs():
    return [torch.randn(6, 5)]


def get_init_inputs():
    return []
'''


@pytest.fixture
def doubling(tmp_path: Path) -> Task:
    path = tmp_path / "doubles.py"
    path.write_text(_TASK)
    return Task.from_file(path)


def test_the_reference_answers_each_timed_set_at_the_positions_asked(
        doubling: Task, fast_config: EvalConfig) -> None:
    run = reference_cache.run_reference(doubling, fast_config, "cpu", keep_child=True,
                                        cache=False)
    try:
        sets = timed_set_count(fast_config.timing.input_sets)
        assert len(run.expected) == fast_config.trials + EXTRA_TRIALS  # the trials' only
        taken = [{"call": 0, "set": 1, "leaves": [{"positions": [0, 29, 7]},
                                                  {"positions": [0]}, {"scalar": 3}]},
                 {"call": 1, "set": 1, "leaves": [{"positions": [7, 30, -1]}]},
                 {"call": 2, "set": sets - 1, "leaves": [{"positions": [4]}]},
                 # forged by a candidate's child: a set the reference does not have, and
                 # more positions than a sample holds; neither is computed
                 {"call": 3, "set": 99, "leaves": [{"positions": [0]}]},
                 {"call": 4, "set": 0, "leaves": [{"positions": list(range(17))}]}]
        answers = run.timed_answers(taken, fast_config.device_lock)
        assert not isinstance(answers, str), answers
        assert sorted(answers) == [0, 1, sets - 1]  # the sets asked about it has, no other
        assert answers[0][0] is not None and answers[0][0].values == {}
        assert "unknown input set" in str(check.timed_outputs_problem(
            answers, taken[3:4], 30, 1e-3, 1e-3))
        assert "malformed" in str(check.timed_outputs_problem(
            answers, [{**taken[4], "leaves": [
                {"shape": [6, 5], "positions": list(range(17)), "values": [0.0] * 17},
                {"shape": [], "positions": [0], "values": [0.0]}, {"scalar": 3}]}],
            30, 1e-3, 1e-3))
        x = read_leaves(run.inputs_dir / "pool_1.pt", trusted=True)[0]
        doubled, total, scalar = answers[1]
        assert doubled is not None and doubled.shape == [6, 5]
        # the positions of both calls on set 1, those within the output only
        assert doubled.values == pytest.approx({p: float(x.reshape(-1)[p] * 2 + 1)
                                                for p in (0, 7, 29)})
        assert total is not None and total.shape == [] and total.values == pytest.approx(
            {0: float(x.sum())})
        assert scalar is None  # not a tensor: compared in the trials
        assert list(answers[sets - 1][0].values) == [4]
        assert run.timed_answers([], fast_config.device_lock) == {}  # nothing to ask
    finally:
        run.close()
    # no live child: said, not raised
    assert "no live child" in str(run.timed_answers(taken, fast_config.device_lock))


def _sample(positions: list[int], values: list[float], shape: list[int]) -> dict[str, Any]:
    return {"shape": shape, "positions": positions, "values": values}


def test_sampled_values_are_held_to_the_reference_s_answers() -> None:
    leaf = check.SampledLeaf.of(_sample([0, 3], [1.0, 2.0], [4]))
    assert leaf is not None and leaf.numel == 4
    answers = {0: [leaf]}

    def problem(positions: list[int], values: list[float], shape: list[int] | None = None,
                on_set: int = 0) -> str | None:
        taken = [{"call": 5, "set": on_set,
                  "leaves": [_sample(positions, values, shape or [4])]}]
        return check.timed_outputs_problem(answers, taken, 30, 1e-3, 1e-3)

    # a sample draws min(16, numel) positions, with repeats
    assert problem([0, 3, 3, 0], [1.0, 2.0, 2.0, 1.0]) is None
    assert "1 of 4 sampled values differ" in str(problem([0, 3, 3, 0], [1.0, 2.5, 2.0, 1.0]))
    assert "shape [2, 2]" in str(problem([0, 3, 3, 0], [1.0, 2.0, 2.0, 1.0], [2, 2]))
    # a position the reference was not asked about, or too few of them
    assert "malformed" in str(problem([0, 1, 3, 0], [1.0, 2.0, 2.0, 1.0]))
    assert "malformed" in str(problem([0, 3], [1.0, 2.0]))
    assert "unknown input set" in str(problem([0, 3, 3, 0], [1.0, 2.0, 2.0, 1.0], on_set=4))
    assert check.SampledLeaf.of({"shape": None}) is None
    with pytest.raises(ValueError):
        check.SampledLeaf.of({"shape": [2], "positions": [0, 1], "values": [1.0]})


def test_outputs_the_reference_cannot_answer_withhold_the_figure_and_fail_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's child gone (out of memory, say) between the window and the check:
    no fault of the candidate's is shown, and no figure is either."""
    child = SimpleNamespace(timed_calls=30, probes_timed=2)
    timer = Timer(child, "candidate")  # type: ignore[arg-type]
    timer.samples = [1.0] * 30
    timer.outputs = [{"call": 0, "set": 0, "leaves": []}]
    reference = SimpleNamespace(own_error={},
                                timed_answers=lambda taken, scope: "its child is gone")
    verdict = candidate_windows.timed_dishonestly(reference, timer,  # type: ignore[arg-type]
                                                  EvalConfig(device="cpu"))
    assert verdict is None
    assert timer.withheld == "its timed calls' outputs could not be checked: its child is gone"


@pytest.mark.parametrize(("item", "says"), [
    ({"call": 1, "set": 0, "leaves": 5}, "malformed"),
    ({"call": 1, "set": 0, "leaves": [{"positions": {}}]}, "malformed"),
    ({"call": 1, "set": 0, "leaves": [{"positions": list(range(17))}]}, "malformed"),
    ({"call": 1, "set": 0, "leaves": [{}] * 9}, "malformed"),
    ({"call": 1, "set": 7, "leaves": []}, "unknown input set"),
    ({"call": 1, "set": True, "leaves": []}, "unknown input set"),
    ("a string", "malformed"),
])
def test_samples_no_sampler_sends_are_incorrect_before_the_reference_is_asked(
        item: Any, says: str) -> None:
    """The reference computes what the samples ask for: a forged sample is judged from
    its shape first, and the reference is never asked."""
    child = SimpleNamespace(timed_calls=30, probes_timed=2)
    timer = Timer(child, "candidate")  # type: ignore[arg-type]
    timer.samples, timer.outputs = [1.0] * 30, [item]

    def never(taken: Any, scope: str) -> Any:
        raise AssertionError("the reference was asked")

    reference = SimpleNamespace(own_error={}, timed_answers=never)
    verdict = candidate_windows.timed_dishonestly(reference, timer,  # type: ignore[arg-type]
                                                  EvalConfig(device="cpu"))
    assert verdict is not None and verdict.status == "incorrect" and says in verdict.message


_WRITES_ITS_INPUT = _TASK.replace("return x * 2.0 + 1.0, x.sum(), 3",
                                  "x.add_(1.0)\n        return x * 2.0")


def test_a_reference_that_writes_into_its_inputs_answers_for_them_as_drawn(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    """Its own timed calls (and an answer) change its copy of a set in place: the answer
    is for the set as drawn, which a candidate's timed calls were given."""
    path = tmp_path / "writes.py"
    path.write_text(_WRITES_ITS_INPUT)
    run = reference_cache.run_reference(Task.from_file(path), fast_config, "cpu",
                                        keep_child=True, cache=False)
    try:
        x = read_leaves(run.inputs_dir / "pool_0.pt", trusted=True)[0].reshape(-1)
        taken = [{"call": 0, "set": 0, "leaves": [{"positions": [0, 3]}]}]
        for _ in range(2):
            answers = run.timed_answers(taken, fast_config.device_lock)
            assert not isinstance(answers, str), answers
            leaf = answers[0][0]
            assert leaf is not None
            assert leaf.values == pytest.approx({p: float((x[p] + 1) * 2) for p in (0, 3)})
    finally:
        run.close()


def test_an_input_set_s_fingerprint_sees_changes_that_keep_its_sum() -> None:
    """A flip or a sort in place keeps the sum: the strided partial sums still tell."""
    x = torch.arange(40, dtype=torch.float32).reshape(4, 10)
    drawn = _fingerprint([x, 3])
    assert _fingerprint([x.clone(), 3]) == drawn
    assert _fingerprint([x.flip(1), 3]) != drawn
    assert _fingerprint([x.roll(1, 0), 3]) != drawn
    assert _fingerprint([x, 4]) != drawn
    assert _fingerprint([x.t()]) == _fingerprint([x.t()])  # not contiguous: whole sum only
    nan = torch.tensor([float("nan"), 1.0])
    assert _fingerprint([nan]) == _fingerprint([nan.clone()])


def test_an_answer_the_reference_ran_out_of_memory_for_is_asked_once_more(
        tmp_path: Path, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A card full of other evaluations' memory: the answer comes from a second asking;
    other failures, and a second out of memory, are said as they were."""
    from pike.evaluate import reference as reference_module
    waits: list[float] = []
    monkeypatch.setattr(reference_module, "_wait_to_ask_again", waits.append)
    path = tmp_path / "task.py"
    path.write_text(_TASK)
    run = reference_cache.run_reference(Task.from_file(path), fast_config, "cpu",
                                        keep_child=True, cache=False)
    try:
        asked = run._ask
        taken = [{"call": 0, "set": 0, "leaves": [{"positions": [0, 3]}]}]
        full = {"sets": None, "error": "torch.OutOfMemoryError: CUDA out of memory."}
        replies: list[Any] = [full]
        monkeypatch.setattr(run, "_ask", lambda *a, **k: replies.pop(0) if replies
                            else asked(*a, **k))
        answers = run.timed_answers(taken, fast_config.device_lock)
        assert not isinstance(answers, str) and answers[0][0] is not None, answers
        assert waits == [reference_module._ANSWER_AGAIN_S]
        replies[:] = [full, full]
        assert "out of memory" in str(run.timed_answers(taken, fast_config.device_lock))
        replies[:] = [{"sets": None, "error": "RuntimeError: boom"}]
        assert run.timed_answers(taken, fast_config.device_lock) == "RuntimeError: boom"
        assert len(waits) == 2
    finally:
        run.close()
