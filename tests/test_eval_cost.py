"""The cuts in an evaluation's cost keep its verdicts: outputs compared in chunks give the
same counts and errors as compared whole, inputs drawn on the device fall back to the host
where get_inputs() cannot run there, and the evaluator's files go where they are fastest
without leaving a user's choice aside."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch

from pike.evaluate import check, leftovers, runner
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
    drawn = runner._draw_inputs(module, request, 7, torch.device("meta"))
    again = runner._draw_inputs(module, request, 7)
    assert drawn[0].device.type == "cpu" and torch.equal(drawn[0], again[0])

    def on_any_device() -> list[torch.Tensor]:
        return [torch.rand(4, 3)]

    module.get_inputs = on_any_device
    assert runner._draw_inputs(module, request, 7, torch.device("meta"))[0].is_meta


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
