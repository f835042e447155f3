"""The offline rewrite of a mixture of experts' loop over its experts into one grouped
computation: where it applies, what it leaves alone, and that it stays within tolerance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pike.agents.offline import applicable, compatible, render
from pike.agents.offline_moe import grouped_forwards
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.task import Task

# DeepSeek-V3's reference MoE (KernelBench level 5's 7 and 13), small
MOE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    def __init__(self, dim, inter):
        super().__init__()
        self.w1 = nn.Linear(dim, inter, bias=False)
        self.w2 = nn.Linear(inter, dim, bias=False)
        self.w3 = nn.Linear(dim, inter, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Model(nn.Module):
    def __init__(self, dim, inter, n_experts, topk):
        super().__init__()
        self.dim, self.n_routed_experts, self.topk = dim, n_experts, topk
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList([Expert(dim, inter) for _ in range(n_experts)])
        self.shared_experts = Expert(dim, inter)

    def forward(self, x):
        shape = x.size()
        x = x.view(-1, self.dim)
        scores = self.gate(x).softmax(dim=-1, dtype=torch.float32)
        indices = torch.topk(scores, self.topk, dim=-1)[1]
        weights = scores.gather(1, indices).type_as(x)
        y = torch.zeros_like(x)
        counts = torch.bincount(indices.flatten(), minlength=self.n_routed_experts).tolist()
        for i in range(self.n_routed_experts):
            if counts[i] == 0:
                continue
            expert = self.experts[i]
            idx, top = torch.where(indices == i)
            y[idx] += expert(x[idx]) * weights[idx, top, None]
        z = self.shared_experts(x)
        return (y + z).view(shape)


def get_inputs():
    return [torch.randn(2, 12, 32)]


def get_init_inputs():
    return [32, 48, 8, 3]
"""


def _task(tmp_path: Path, source: str) -> Task:
    path = tmp_path / "1_MoE.py"
    path.write_text(source)
    return Task.from_file(path)


def _built(source: str, names: tuple[str, ...] = ("moe_grouped",),
           dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    ns: dict[str, Any] = {"__name__": "pike_offline_test"}
    exec(compile(render(source, names), "offline.py", "exec"), ns)
    init = ns["get_init_inputs"]()
    torch.manual_seed(0)
    reference = ns["Model"](*init).to(dtype)
    torch.manual_seed(0)
    return reference, ns["ModelNew"](*init).to(dtype)


def _same(candidate: Any, reference: Any, x: torch.Tensor, tolerance: float = 0.0) -> None:
    """Both called as the evaluator calls them, outside autograd."""
    with torch.no_grad():
        torch.testing.assert_close(candidate(x.clone()), reference(x.clone()), atol=tolerance,
                                   rtol=tolerance)  # (clones: a forward may add into x)


def _stack_of(candidate: Any) -> Any:
    kept = list(candidate.inner.experts.__dict__.get("_pike_stacks", {}).values())
    return kept[0][0] if kept else None


def test_the_loop_is_replaced_by_one_call_and_the_counts_sync_goes_with_it() -> None:
    (found,) = grouped_forwards(MOE)
    assert found.class_name == "Model" and found.function_name == "_Model_forward_grouped"
    assert ("_grouped_experts(self.experts, self.n_routed_experts, x, weights, indices, y)"
            in found.source)
    assert "for i in" not in found.source and "bincount" not in found.source
    assert "z = self.shared_experts(x)" in found.source  # the rest kept as written


@pytest.mark.parametrize("change", [
    {},
    {"            if counts[i] == 0:\n                continue\n": ""},  # no skip
    {"            expert = self.experts[i]\n": "",
     "y[idx] += expert(": "y[idx] += self.experts[i]("},  # the expert indexed in place
    {"expert(x[idx]) * weights[idx, top, None]":
     "weights[idx, top, None] * expert(x[idx])"},  # the product the other way round
])
def test_its_forms_are_found(change: dict[str, str]) -> None:
    source = MOE
    for old, new in change.items():
        source = source.replace(old, new)
    assert [f.class_name for f in grouped_forwards(source)] == ["Model"]


@pytest.mark.parametrize("change", [
    {"            y[idx] +=": "            print(i)\n            y[idx] +="},  # more in the loop
    {"range(self.n_routed_experts):": "range(1, self.n_routed_experts):"},  # some experts
    {"torch.where(indices == i)": "torch.where(indices != i)"},
    {"weights[idx, top, None]": "weights[idx, 0, None]"},
    {"y[idx] += expert(x[idx])": "y[idx] += expert(x[idx] * 2)"},
    {"y[idx] +=": "y[idx] -="},
    {"        z = self.shared_experts(x)": "        z = self.shared_experts(x[idx])"},  # read after
    {"        z = self.shared_experts(x)": "        del expert\n        z = self.shared_experts(x)"},
    {"    def forward(self, x):\n        shape":
     "    def forward(self, x):\n        super().forward\n        shape"},  # needs its class
])
def test_anything_else_is_not_found(change: dict[str, str]) -> None:
    source = MOE
    for old, new in change.items():
        assert old in source
        source = source.replace(old, new)
    assert grouped_forwards(source) == []
    assert "moe_grouped" not in applicable(source, "cuda:0")


def test_counts_read_elsewhere_are_kept() -> None:
    source = MOE.replace("        z = self.shared_experts(x)\n",
                         "        z = self.shared_experts(x) * len(counts)\n")
    (found,) = grouped_forwards(source)
    assert "counts = torch.bincount" in found.source
    # only the statement that counted the routes goes: the name set again later stays
    later = MOE.replace("        z = self.shared_experts(x)\n",
                        "        z = self.shared_experts(x)\n        counts = self.log(z)\n")
    (found,) = grouped_forwards(later)
    assert "counts = self.log(z)" in found.source and "bincount" not in found.source


def test_it_is_tried_first_on_a_gpu_and_never_inside_a_cuda_graph() -> None:
    assert applicable(MOE, "cuda:0")[0] == "moe_grouped"
    assert "moe_grouped" in applicable(MOE, "cpu")
    assert not compatible(("moe_grouped", "cuda_graph"))
    assert not compatible(("moe_grouped", "compile:reduce-overhead"))
    assert compatible(("moe_grouped", "compile:default", "tf32"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grouped_experts_stay_close_to_the_loop_and_hold_one_copy_of_the_weights(
        dtype: torch.dtype) -> None:
    reference, candidate = _built(MOE, dtype=dtype)
    assert candidate.experts_grouped == 1
    for shape in [(2, 12, 32), (1, 1, 32), (5, 7, 32)]:
        x = torch.randn(*shape, dtype=dtype)
        _same(candidate, reference, x, 1e-5 if dtype == torch.float32 else 2e-2)
    gate_up, down = _stack_of(candidate)
    storages = {p.untyped_storage().data_ptr() for e in candidate.inner.experts
                for p in e.parameters()}
    assert storages == {gate_up.untyped_storage().data_ptr(),
                        down.untyped_storage().data_ptr()}


def test_weights_changed_in_place_reach_the_stack() -> None:
    reference, candidate = _built(MOE)
    x = torch.randn(2, 12, 32)
    _same(candidate, reference, x, 1e-5)
    with torch.no_grad():
        for model in (reference, candidate.inner):
            model.experts[3].w2.weight.mul_(-2.0)
            model.experts[0].w1.weight.add_(0.5)
    _same(candidate, reference, x, 1e-5)
    assert _stack_of(candidate) is not None


@pytest.mark.parametrize("change", [
    {"return self.w2(F.silu(self.w1(x)) * self.w3(x))":
     "return self.w2(F.gelu(self.w1(x)) * self.w3(x))"},  # another activation
    {"self.w2 = nn.Linear(inter, dim, bias=False)": "self.w2 = nn.Linear(inter, dim)"},
])
def test_experts_of_another_form_run_the_loop_as_written(change: dict[str, str]) -> None:
    source = MOE
    for old, new in change.items():
        assert old in source
        source = source.replace(old, new)
    reference, candidate = _built(source)
    assert candidate.experts_grouped == 1  # the forward is the rewritten one ...
    x = torch.randn(2, 12, 32)
    x[0, :2] = 0.0  # rows any activation passes: the probe brings its own
    _same(candidate, reference, x)
    assert _stack_of(candidate) is None  # ... and took the loop
    assert all(len({p.untyped_storage().data_ptr() for p in e.parameters()}) == len(
        list(e.parameters())) for e in candidate.inner.experts)  # weights untouched


def test_routes_the_loop_would_skip_run_the_loop_as_written() -> None:
    """Routes outside the loop's experts, or to one expert twice, are the loop's own."""
    source = MOE.replace("        y = torch.zeros_like(x)\n",
                         "        y = torch.zeros_like(x)\n        indices[0, 0] = OTHER\n")
    for other in ("self.n_routed_experts", "indices[0, 1]"):  # (a negative one: bincount fails)
        reference, candidate = _built(source.replace("OTHER", other))
        _same(candidate, reference, torch.randn(2, 12, 32))


def test_it_composes_with_compile_and_passes_the_evaluator(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    task = _task(tmp_path, MOE)
    verdict = evaluate(task, render(task.source, ("moe_grouped", "inference_mode")),
                       fast_config)
    assert verdict.status == "ok", verdict.message
    reference, candidate = _built(MOE, ("moe_grouped", "compile:default"))
    for seed in range(3):  # other routings, other capacities: no build for each
        torch.manual_seed(seed)
        _same(candidate, reference, torch.randn(2, 12, 32), 1e-4)
    assert _stack_of(candidate) is not None


@pytest.mark.parametrize("change", [
    {"        y = torch.zeros_like(x)\n": "        y = torch.zeros_like(x)\n"
     "        counts = [1] * self.n_routed_experts\n"},  # counts that are not the routes'
    {"torch.bincount(indices.flatten()": "torch.bincount(indices[:, 0]"},
    {"minlength=self.n_routed_experts": "minlength=self.topk"},
    {"y[idx] += expert(x[idx])": "x[idx] += expert(x[idx])"},  # adds into what it reads
    {"        return (y + z).view(shape)\n": "        return (y + z).view(shape)\n\n"
     "    def forward(self, x):\n        return x\n"},  # a second forward, the one kept
    {"x = x.view(-1, self.dim)": "x = x.view(-1, self.__dim)"},  # mangled in its class
])
def test_loops_that_only_look_alike_are_not_found(change: dict[str, str]) -> None:
    source = MOE
    for old, new in change.items():
        assert old in source
        source = source.replace(old, new)
    assert grouped_forwards(source) == []


def test_an_expert_of_another_class_among_them_runs_the_loop() -> None:
    source = MOE.replace("class Model(", """class GeluExpert(Expert):
    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)) * self.w3(x))


class Model(""").replace(
        "self.experts = nn.ModuleList([Expert(dim, inter) for _ in range(n_experts)])",
        "self.experts = nn.ModuleList([GeluExpert(dim, inter) if i == 3 else "
        "Expert(dim, inter) for i in range(n_experts)])")
    reference, candidate = _built(source)
    _same(candidate, reference, torch.randn(2, 12, 32))
    assert _stack_of(candidate) is None


def test_experts_replaced_or_hooked_after_the_first_call_are_followed() -> None:
    reference, candidate = _built(MOE)
    x = torch.randn(2, 12, 32)
    _same(candidate, reference, x, 1e-5)
    torch.manual_seed(1)
    fresh = type(reference.experts[4])(32, 48)
    for model in (reference, candidate.inner):
        model.experts[4] = type(fresh)(32, 48)
        model.experts[4].load_state_dict(fresh.state_dict())
        with torch.no_grad():
            model.experts[5].w2.weight = torch.nn.Parameter(torch.ones(32, 48))
    _same(candidate, reference, x, 1e-5)
    calls: list[int] = []
    candidate.inner.experts[2].register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        candidate(x)
    assert calls  # the hook ran: the loop did, as written


def test_with_autograd_on_the_loop_runs_and_gradients_reach_the_experts() -> None:
    reference, candidate = _built(MOE)
    x = torch.randn(2, 12, 32)
    candidate(x).sum().backward()
    assert _stack_of(candidate) is None
    assert candidate.inner.experts[0].w1.weight.grad is not None or \
        candidate.inner.experts[1].w1.weight.grad is not None


def test_an_output_that_is_the_input_or_experts_in_a_list_run_the_loop() -> None:
    aliased = MOE.replace("y = torch.zeros_like(x)", "y = x")
    reference, candidate = _built(aliased)
    _same(candidate, reference, torch.randn(2, 12, 32))
    assert _stack_of(candidate) is None
    listed = MOE.replace("self.experts = nn.ModuleList(", "self.experts = list(")
    reference, candidate = _built(listed)
    _same(candidate, reference, torch.randn(2, 12, 32))


def test_a_grouped_model_can_be_copied_after_its_first_call() -> None:
    import copy
    reference, candidate = _built(MOE)
    x = torch.randn(2, 12, 32)
    _same(candidate, reference, x, 1e-5)
    _same(copy.deepcopy(candidate), reference, x, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_grouped_experts_stay_close_and_pass_the_evaluator(
        tmp_path: Path, fast_config: EvalConfig, dtype: torch.dtype) -> None:
    reference, candidate = _built(MOE, dtype=dtype)
    reference, candidate = reference.cuda(), candidate.cuda()
    for shape in [(2, 12, 32), (4, 64, 32), (1, 1, 32)]:
        x = torch.randn(*shape, dtype=dtype, device="cuda")
        _same(candidate, reference, x, 1e-5 if dtype == torch.float32 else 2e-2)
    assert _stack_of(candidate) is not None
    fast_config.device = "cuda"
    task = _task(tmp_path, MOE)
    verdict = evaluate(task, render(task.source, ("moe_grouped", "sdpa")), fast_config)
    assert verdict.status == "ok", verdict.message
