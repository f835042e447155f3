"""A check loads its trials' inputs one set at a time, so a task of 1 GiB trials holds one of
them on the device, not six: a candidate's, and the reference's own forward passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pike.config import TimingConfig
from pike.evaluate import candidate_role, child_serving, child_setup, reference_role
from pike.evaluate.leaf_files import write_leaves
from pike.evaluate.protocol import ChildRequest


class Parent:
    """The parent's side of the stage request: says the phase is staged."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, event: str, **fields: Any) -> None:
        self.sent.append({"event": event, **fields})

    def receive(self) -> dict[str, Any]:
        return {"event": "staged", "phase": self.sent[-1]["phase"]}


def request(folder: Path) -> ChildRequest:
    return ChildRequest(role="candidate", module_path="c.py", class_names=["ModelNew"],
                        inputs_dir=str(folder), outputs_dir=str(folder), device="cpu",
                        trials=2, seed=0, model_mode="as_constructed", timing=TimingConfig())


def test_each_trials_inputs_are_loaded_only_when_the_last_are_done_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for trial in range(3):
        write_leaves([torch.full((4,), float(trial))], tmp_path / f"inputs_{trial}.pt")
    req = request(tmp_path)
    loaded: list[str] = []
    read = child_setup.read_leaves
    monkeypatch.setattr(child_setup, "read_leaves",
                        lambda path, **kw: loaded.append(path.name) or read(path, **kw))
    parent = Parent()
    names = [f"inputs_{t}" for t in range(3)]
    sets = candidate_role._staged_one_by_one(parent, req, torch.device("cpu"), "check", names)  # type: ignore[arg-type]
    first = next(sets)
    assert parent.sent == [{"event": "stage", "phase": "check"}]
    assert loaded == ["inputs_0.pt"] and float(first[0][0]) == 0.0
    assert [float(s[0][0]) for s in sets] == [1.0, 2.0]
    assert loaded == [f"inputs_{t}.pt" for t in range(3)]


def test_a_stage_the_parent_refuses_fails_before_anything_is_loaded(tmp_path: Path) -> None:
    class Refusing(Parent):
        def receive(self) -> dict[str, Any]:
            return {"event": "refused"}

    req = request(tmp_path)
    with pytest.raises(child_setup.Failure, match="did not stage the check inputs"):
        candidate_role._staged_inputs(Refusing(), req, torch.device("cpu"), "check", ["inputs_0"])  # type: ignore[arg-type]


def test_a_set_the_check_is_done_with_is_freed_before_the_next_is_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import weakref
    for trial in range(3):
        write_leaves([torch.full((4,), float(trial))], tmp_path / f"inputs_{trial}.pt")
    kept: list[weakref.ref] = []
    alive_at_load: list[list[bool]] = []
    read = child_setup.read_leaves

    def reading(path: Path, **kw: Any) -> list[Any]:
        alive_at_load.append([r() is not None for r in kept])
        return read(path, **kw)

    monkeypatch.setattr(child_setup, "read_leaves", reading)
    names = [f"inputs_{t}" for t in range(3)]
    for inputs in candidate_role._staged_one_by_one(Parent(), request(tmp_path),  # type: ignore[arg-type]
                                                    torch.device("cpu"), "check", names):
        kept.append(weakref.ref(inputs[0]))
        del inputs  # as the check does after its call
    assert alive_at_load == [[], [False], [False, False]]


def test_the_references_check_reads_each_trials_inputs_back_one_set_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference saves every trial's inputs as it draws them, then reads each set back
    for its forward only when the last is done with (a kept reference had held all six in
    its allocator's cache through the search). The timing pool's sets get no forward
    there: their outputs are computed when a window's samples are checked."""
    import weakref
    for trial in range(3):
        write_leaves([torch.full((4,), float(trial))], tmp_path / f"inputs_{trial}.pt")
    kept: list[weakref.ref] = []
    alive_at_load: list[list[bool]] = []
    read = child_setup.read_leaves

    def reading(path: Path, **kw: Any) -> list[Any]:
        alive_at_load.append([r() is not None for r in kept])
        return read(path, **kw)

    monkeypatch.setattr(child_setup, "read_leaves", reading)
    seen = []
    for name, inputs in reference_role._reference_check_inputs(tmp_path, 3,
                                                               torch.device("cpu")):
        seen.append((name, float(inputs[0][0])))
        kept.append(weakref.ref(inputs[0]))
        del inputs  # as the reference does after its forward
    assert seen == [("outputs_0", 0.0), ("outputs_1", 1.0), ("outputs_2", 2.0)]
    assert alive_at_load == [[], [False], [False, False]]  # nothing read is held meanwhile


class Script:
    """The parent's side of a timing conversation: these requests, then the end."""

    def __init__(self, *requests: dict[str, Any]) -> None:
        self.requests, self.sent = list(requests), []  # type: list[dict[str, Any]]

    def receive(self) -> dict[str, Any] | None:
        return self.requests.pop(0) if self.requests else None

    def send(self, event: str, **fields: Any) -> None:
        self.sent.append({"event": event, **fields})


_BLOCK = {"event": "time", "mode": "candidate", "warm_up": True, "min_calls": 2,
          "min_seconds": 0.0, "max_calls": 3, "seq": "b"}


def test_timed_inputs_staged_before_the_window_are_not_loaded_again_in_it(
        tmp_path: Path) -> None:
    # The window's first block used to load them (up to 7 GiB on a level2 task), with the
    # device held alone; staged ahead, the block times calls only.
    made: list[str] = []

    def make_call(mode: str) -> Any:
        made.append(mode)
        return lambda: torch.zeros(1)

    def failed(mode: str, exc: BaseException, seq: object) -> None:
        raise AssertionError(f"{mode} failed: {exc}")

    chan = Script({"event": "stage_timed_inputs", "mode": "candidate", "seq": "a"}, _BLOCK)
    child_serving._serve_timing(request(tmp_path), chan, torch.device("cpu"),  # type: ignore[arg-type]
                                make_call, failed)
    assert made == ["candidate"]
    assert [(m["event"], m["seq"]) for m in chan.sent] == [
        ("timed_inputs_staged", "a"), ("timed", "b")]
    assert "error" not in chan.sent[0] and chan.sent[1]["samples"]


def test_timed_inputs_that_do_not_load_end_a_candidate_as_a_block_would(
        tmp_path: Path) -> None:
    def make_call(mode: str) -> Any:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    class Ended(Exception):
        pass

    def failed(mode: str, exc: BaseException, seq: object) -> None:
        raise Ended(str(exc))  # a candidate's: child_setup.Failure, which ends its child

    chan = Script({"event": "stage_timed_inputs", "mode": "candidate", "seq": "a"}, _BLOCK)
    with pytest.raises(Ended, match="out of memory"):
        child_serving._serve_timing(request(tmp_path), chan, torch.device("cpu"),  # type: ignore[arg-type]
                                    make_call, failed)
    assert chan.sent == []
    # a child that reports a mode's failure and goes on (the reference's) answers with it
    reported: list[str] = []
    chan = Script({"event": "stage_timed_inputs", "mode": "candidate", "seq": "a"})
    child_serving._serve_timing(request(tmp_path), chan, torch.device("cpu"),  # type: ignore[arg-type]
                                make_call, lambda mode, exc, seq: reported.append(mode))
    assert reported == ["candidate"]
    assert chan.sent[-1]["event"] == "timed_inputs_staged"
    assert "out of memory" in chan.sent[-1]["error"]
