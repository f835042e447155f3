"""A baseline's autotuning mode is compiled once beside other evaluations and thrown away
(compiled_modes.prebuild_mode): its own build, with the device held alone, must trace, compile and
autotune again, and may only find the pre-build's compiled kernels. Inductor keeps whole
results in two caches on disk (the compiled graph, which carries autotuning's choices, and
the AOT autograd entry around it); a pre-build that left them would hand its choices, made
beside other work, to the mode's own build."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slow


def _model(width: int) -> torch.nn.Module:
    # a width of its own: no earlier test's compile of the same graph is in the caches
    return torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                               torch.nn.Linear(2 * width, width)).eval()


def _hits() -> int:
    from torch._dynamo.utils import counters
    return counters["inductor"]["fxgraph_cache_hit"] + \
        counters["aot_autograd"]["autograd_cache_hit"]


def _misses() -> int:
    from torch._dynamo.utils import counters
    return counters["inductor"]["fxgraph_cache_miss"] + \
        counters["aot_autograd"]["autograd_cache_miss"]


def _own_build(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    from torch._dynamo.utils import counters
    counters.clear()
    fn = torch.compile(_copy(model), mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        return fn(x)


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy
    return copy.deepcopy(model)


def test_the_mode_s_own_build_reuses_nothing_of_its_pre_build(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate.compiled_modes import prebuild_mode

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    model, x = _model(48), torch.randn(16, 48)
    with torch.no_grad():
        expected = model(x)
    prebuild_mode(model, "compile:max-autotune-no-cudagraphs", lambda fn: fn(x), cpu)
    got = _own_build(model, x)
    assert _hits() == 0 and _misses() >= 1  # the caches were asked, and had nothing
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)

    # The control: the same two builds with inductor's caches left as they are: the second
    # build takes the first one's result whole (what the pre-build must not allow).
    torch._dynamo.reset()
    other = _model(40)
    y = torch.randn(16, 40)
    _own_build(other, y)
    torch._dynamo.reset()
    _own_build(other, y)
    assert _hits() >= 1
    torch._dynamo.reset()


def test_the_mode_s_own_build_measures_every_kernel_choice_again(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Autotuning's timings are written to inductor's cache file whatever
    autotune_local_cache says (helper-22's review): a pre-build that left its timings
    there handed them to the own build, which then measured nothing. With freezing, the
    CPU's GEMMs are autotuned (C++ templates against MKL), so the lookup runs here."""
    import torch._inductor.codecache as codecache
    import torch._inductor.config as inductor_config

    from pike.evaluate.compiled_modes import prebuild_mode

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    looked_up: list[bool] = []  # one per lookup that had a benchmark: whether it ran
    real = codecache.PersistentCache.lookup

    def lookup(self: Any, choices: Any, op: str, inputs: str, benchmark: Any,
               *args: Any, **kwargs: Any) -> Any:
        ran: list[int] = []
        counted = None if benchmark is None else (
            lambda chosen: (ran.append(1), benchmark(chosen))[1])
        timings = real(self, choices, op, inputs, counted, *args, **kwargs)
        if benchmark is not None:
            looked_up.append(bool(ran))
        return timings

    monkeypatch.setattr(codecache.PersistentCache, "lookup", lookup)
    torch.manual_seed(0)
    model, x = _model(56), torch.randn(24, 56)
    with inductor_config.patch(freezing=True):
        prebuild_mode(model, "compile:max-autotune-no-cudagraphs", lambda fn: fn(x),
                      torch.device("cpu"))
        if not looked_up:
            pytest.skip("this CPU's GEMMs are not autotuned (no C++ GEMM template)")
        looked_up.clear()
        _own_build(model, x)
    torch._dynamo.reset()
    assert looked_up and all(looked_up), looked_up
