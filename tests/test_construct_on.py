"""eval.construct_on: models built on the device itself (tasks written to be built on the
GPU), both sides alike, and never confused in the reference cache with models built on the
CPU."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

from pike.config import EvalConfig, TimingConfig
from pike.evaluate import judge
from pike.evaluate.protocol import ChildRequest
from pike.evaluate.runner import Failure, _build_model
from pike.task import Task


class BuiltOnMeta(torch.nn.Module):
    """Fails unless its constructor runs where the model is meant to live (meta here)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        if self.w.device.type != "meta":
            raise RuntimeError(f"built on {self.w.device}")


def request(construct_on: str) -> ChildRequest:
    return ChildRequest(role="reference", module_path="task.py", class_names=["Model"],
                        inputs_dir=".", outputs_dir=".", device="meta", trials=1, seed=0,
                        model_mode="as_constructed", construct_on=construct_on,
                        timing=TimingConfig())


def test_construct_on_device_runs_the_constructor_on_the_device() -> None:
    module = types.SimpleNamespace(Model=BuiltOnMeta)
    model = _build_model(request("device"), module, [], torch.device("meta"), "task_error")
    assert model.w.device.type == "meta"
    assert torch.empty(1).device.type == "cpu"  # the default device is given back
    with pytest.raises(Failure, match="built on cpu"):
        _build_model(request("cpu"), module, [], torch.device("meta"), "task_error")


def test_the_reference_cache_keeps_apart_models_built_or_timed_differently(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "1_T.py"
    path.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    pass\n\n\n"
                    "def get_inputs():\n    return []\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    task = Task.from_file(path)
    started: list[tuple[str, float]] = []

    def start(task: Task, cfg: EvalConfig, device: str, keep_child: bool) -> Any:
        started.append((cfg.construct_on, cfg.timing.warmup_calls))
        return types.SimpleNamespace(usable=lambda: True, users=0, close=lambda: None)

    monkeypatch.setattr(judge, "_start_reference", start)
    try:
        # (where built, warm-up calls the child makes, timed seconds a block's request asks)
        for construct_on, warm_ups, seconds in [("cpu", 3, 0.1), ("device", 3, 0.1),
                                                ("cpu", 3, 0.1), ("cpu", 4, 0.1),
                                                ("cpu", 3, 0.5)]:
            cfg = EvalConfig(construct_on=construct_on)
            cfg.timing.warmup_calls, cfg.timing.min_seconds = warm_ups, seconds
            judge.run_reference(task, cfg, "cpu", keep_child=True)
    finally:
        judge._references.clear()
    # the last shares the first's child: each block's request carries its seconds (a
    # search's screening windows and its confirming window time the same reference)
    assert started == [("cpu", 3), ("device", 3), ("cpu", 4)]

