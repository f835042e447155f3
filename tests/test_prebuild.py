"""A baseline's autotuning mode is compiled once beside other evaluations and thrown away
(runner.prebuild_mode): its own build, with the device held alone, must trace, compile and
autotune again, and may only find the pre-build's compiled kernels. Inductor keeps whole
results in two caches on disk (the compiled graph, which carries autotuning's choices, and
the AOT autograd entry around it); a pre-build that left them would hand its choices, made
beside other work, to the mode's own build."""

from __future__ import annotations

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
    from pike.evaluate.runner import prebuild_mode

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
