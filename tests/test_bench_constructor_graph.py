"""bench/constructor_graph.py: what a model whose constructor prefills a cache holds."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import bench_script

_PREFILLS = '''import torch


class Model(torch.nn.Module):
    def __init__(self, dim, prompt):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(dim, dim) for _ in range(3)))
        self.register_buffer("cache", torch.zeros(len(prompt), dim))
        self.cache[:] = self.layers(prompt)

    def forward(self, x):
        return self.layers(x) + self.cache.sum(0)


dim = 64
length = 32


def get_inputs():
    return [torch.randn(2, dim)]


def get_init_inputs():
    return [dim, torch.randn(length, dim)]
'''


@pytest.fixture(scope="module")
def constructor_graph() -> ModuleType:
    return bench_script("constructor_graph")


def test_a_build_with_autograd_keeps_the_prefills_graph_and_no_grad_does_not(
        constructor_graph: ModuleType, tmp_path: Path) -> None:
    task = tmp_path / "1_Prefills.py"
    task.write_text(_PREFILLS)
    settings = ["dim=256", "length=1024"]  # read by get_init_inputs after the module ran
    with_graph = constructor_graph.build_once(task, settings, "cpu", no_grad=False)
    without = constructor_graph.build_once(task, settings, "cpu", no_grad=True)
    assert with_graph["buffers_holding_a_graph"] == 1 and without["buffers_holding_a_graph"] == 0
    assert with_graph["own_bytes"] == without["own_bytes"] == (3 * (256 * 256 + 256)
                                                               + 1024 * 256) * 4
    # the meta count: two layers' outputs (the first's input is the prompt, its own
    # storage too) and the prompt are kept, each 1,024 x 256 floats; no attention here
    meta = constructor_graph.meta_count(task, settings)
    assert meta["own_bytes"] == with_graph["own_bytes"]
    assert meta["kept_bytes"] == 3 * 1024 * 256 * 4 and meta["attention_shaped_bytes"] == 0


def test_settings_reach_module_globals_and_their_attributes(
        constructor_graph: ModuleType, tmp_path: Path) -> None:
    task = tmp_path / "2_Args.py"
    task.write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Args:\n"
                    "    dim: int = 8\n\n\nargs = Args()\nsize = 3\n")
    ns = constructor_graph._load(task, ["args.dim=16", "size=5"])
    assert ns["args"].dim == 16 and ns["size"] == 5
