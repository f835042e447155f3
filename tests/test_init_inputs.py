"""Tasks whose get_init_inputs() returns objects of the task's own classes (Level 5 passes
a settings dataclass): the candidate's child gets them as its own classes of that name."""

from __future__ import annotations

from pathlib import Path

from pike.agents.offline import render
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.task import Task

TASK = '''
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class Settings:
    dim: int = 16
    hidden: int = 32


class Model(nn.Module):
    def __init__(self, settings):
        super().__init__()
        self.fc1 = nn.Linear(settings.dim, settings.hidden)
        self.fc2 = nn.Linear(settings.hidden, settings.dim)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(4, Settings().dim)]


def get_init_inputs():
    return [Settings()]
'''

# written from the task by an agent that kept only its model, without the Settings class
WITHOUT_SETTINGS = "import torch\nimport torch.nn as nn\n\n" + TASK[
    TASK.index("class Model("):TASK.index("def get_inputs")].replace("class Model(",
                                                                     "class ModelNew(")


def _task(tmp_path: Path) -> Task:
    path = tmp_path / "1_SettingsMLP.py"
    path.write_text(TASK)
    return Task.from_file(path)


def test_a_candidate_that_defines_the_class_is_built_from_the_tasks_settings(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    task = _task(tmp_path)
    verdict = evaluate(task, render(task.source, ("inference_mode",)), fast_config)
    assert verdict.status == "ok", verdict.message


def test_a_candidate_without_the_class_gets_a_verdict_naming_it(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    verdict = evaluate(_task(tmp_path), WITHOUT_SETTINGS, fast_config)
    assert verdict.status == "runtime_error"
    assert "Settings" in verdict.message and "define" in verdict.message


def test_init_inputs_the_candidate_cannot_load_get_a_verdict_not_a_crash(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    # pickled as getattr(Outer, "Inner"): the loader allows no getattr
    path = tmp_path / "1_NestedSettings.py"
    path.write_text(TASK.replace("@dataclass\nclass Settings:", "class Outer:\n    @dataclass\n"
                                 "    class Settings:").replace(
        "    dim: int = 16\n    hidden: int = 32",
        "        dim: int = 16\n        hidden: int = 32").replace(
        "Settings()", "Outer.Settings()"))
    task = Task.from_file(path)
    verdict = evaluate(task, render(task.source, ("inference_mode",)), fast_config)
    assert verdict.status == "runtime_error", verdict.message
    assert "could not be loaded" in verdict.message
