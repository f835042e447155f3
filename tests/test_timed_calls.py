"""The timed calls' input rotation and the timing loop together (evaluate/timed_calls.py,
evaluate/timing.py)."""

from __future__ import annotations

import time
from pathlib import Path
from types import FrameType

import torch

from pike.config import TimingConfig
from pike.evaluate.timed_calls import InputRotation
from pike.evaluate.timing import time_block

_CHECK_S = 0.02


def test_a_probe_is_taken_from_its_seal_before_its_call_is_timed() -> None:
    """The seal's check of who takes a probe is pike's work, not the candidate's: a probe
    call timed with it looked slower than the rotation's calls, and the reuse check, which
    compares the two, rejected honest files of tiny tasks on a loaded host."""
    checked: list[float] = []

    def slow_check(frame: FrameType, thread: int) -> bool:
        time.sleep(_CHECK_S)
        checked.append(_CHECK_S)
        return False

    sets = [[torch.ones(4)], [torch.ones(4) * 2]]
    probes = [[torch.ones(4) * 3], [torch.ones(4) * 4]]
    rotation = InputRotation(sets, probes, taker_is_foreign=slow_check)
    seen: list[float] = []
    call = rotation.caller(lambda x: x.sum())

    def after(out: torch.Tensor) -> None:  # every call a probe's, while there are any
        seen.append(float(out))
        rotation.probe_next = True

    cfg = TimingConfig(warmup_calls=1, warmup_seconds=0.0)
    samples = time_block(call, torch.device("cpu"), cfg, warm_up=False, min_calls=6,
                         min_seconds=0.0, max_calls=6, after=after)
    assert len(checked) == 2 and sorted(seen)[-2:] == [12.0, 16.0]  # both probes were timed
    assert max(samples) < 1e3 * _CHECK_S / 2, samples
    # a call made outside the timing loop (warm-up, a block's refill) still picks its own
    assert float(call()) in (4.0, 8.0)


def sampler_ops_not_watched(device: str) -> list[str]:
    """The operators the sampler dispatches on ten kinds of leaf on `device`, nested ones
    included, that are not among the watched ones (by name, without overloads)."""
    from torch.profiler import ProfilerActivity, profile

    from pike.evaluate import timed_calls

    leaves = [torch.randn(8, 16), torch.randn(4, 5, 6).half(), torch.randn(7).bfloat16(),
              torch.arange(10), torch.ones(3, 3, dtype=torch.bool), torch.randn(6, 6).t(),
              torch.tensor(3.0), torch.randn(3, 4, dtype=torch.complex64),
              torch.randn(2, 3)[:, 1:], torch.randint(0, 5, (4, 4), dtype=torch.int8)]
    leaves = [leaf.to(device) for leaf in leaves]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for leaf in leaves:
            with torch._C.DisableTorchFunction():
                timed_calls._sample_leaf(leaf, 16)
    ran = {e.name for e in prof.events() if e.name.startswith("aten::")}
    assert ran, "the profiler saw no operator"
    watched = {name.split(".")[0] for name in timed_calls._SAMPLER_OPS}
    return sorted(ran - watched)


def test_every_operator_the_sampler_runs_is_watched() -> None:
    """A kernel for any operator the sampler dispatches, nested ones included, sees the
    sampled coordinates (red team round 10: aten::detach_ inside torch.tensor)."""
    from pike.evaluate import timed_calls

    assert sampler_ops_not_watched("cpu") == []
    assert set(timed_calls._TABLES_AT_IMPORT) == set(timed_calls._SAMPLER_OPS)  # all exist


def test_a_signal_handler_in_force_at_a_probe_take_ends_the_takes() -> None:
    import signal

    told: list[str] = []
    sets, probes = [[torch.zeros(1)]], [[torch.ones(1)], [torch.ones(1)]]
    rotation = InputRotation(sets, probes, tampered=told.append)
    rotation.probe_next = True
    assert rotation._next_set() is probes[0]  # nothing installed: taken
    previous = signal.signal(signal.SIGUSR1, lambda *a: None)
    try:
        rotation.probe_next = True
        assert rotation._next_set() is sets[0]  # refused: the plain set instead
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert told and "SIGUSR1" in told[0]
    rotation.probe_next = True
    assert rotation._next_set() is sets[0]  # no take after it, even with it gone
    assert rotation.used_probes == 1


def test_every_operator_staging_runs_is_watched_and_a_new_kernel_is_seen(
        tmp_path: Path) -> None:
    """A kernel for an operator staging runs saw every input set as it loaded, the probes'
    among them (red team round 11: aten::slice.Tensor); one for any aten operator and key
    it had none for is seen before the timing's staging."""
    from torch.profiler import ProfilerActivity, profile

    from pike.evaluate import timed_calls
    from pike.evaluate.child_setup import _loaded_one_by_one
    from pike.evaluate.leaf_files import write_leaves

    write_leaves([torch.randn(8, 16), torch.randn(3).half(), torch.arange(4), 3, 2.5,
                  torch.randn(6, 6).t()], tmp_path / "pool_0.pt")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in _loaded_one_by_one(tmp_path, ["pool_0"], torch.device("cpu"), "load"):
            pass
    ran = {e.name for e in prof.events() if e.name.startswith("aten::")}
    watched = {name.split(".")[0] for name in timed_calls._SAMPLER_OPS}
    assert ran and ran <= watched, sorted(ran - watched)
    assert timed_calls.added_or_replaced_kernel() is None
    lib = torch.library.Library("aten", "IMPL")  # a key aten::sin had no kernel for
    try:
        lib.impl("sin", lambda x: x, "AutogradCPU")
        assert timed_calls.added_or_replaced_kernel() == "aten::sin (for AutogradCPU)"
    finally:
        lib._destroy()
    assert timed_calls.added_or_replaced_kernel() is None
