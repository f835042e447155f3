"""The timed calls' input rotation and the timing loop together (evaluate/timed_calls.py,
evaluate/timing.py)."""

from __future__ import annotations

import time
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
