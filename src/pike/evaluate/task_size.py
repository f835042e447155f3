"""A task's size before it runs: its inputs, outputs and weights in bytes, found on the
meta device, and what a reference child of it is expected to hold on the host.

The host-memory gate (host_memory) admits a reference child only where the host has room
for what its task's children take. A task nobody had measured was expected at the largest
size any task took: on the H100's level1 bench, 50.9 GiB (42_Max_Pooling_2D) for each new
task, and a 10 GiB matmul's reference waited 300 s behind it. The parent never runs task
code, so the reference's child, already started and waiting for its request, is asked
first (the "size" event): it runs the task's get_init_inputs, get_inputs, Model and one
forward under `torch.device("meta")`, which allocates nothing, and answers with the
bytes it saw.

What a reference holds follows from the protocol (reference_role): every check trial's
and timed set's inputs as files in its scratch, every check trial's expected outputs,
one set of inputs and one output in memory while it computes, and the weights. That is
`structural_bytes`. The rest (torch, the CUDA context, a baseline's compile workers) is
the host's, not the task's: the gate learns it from the tasks it measured (the most any
took beyond its structural bytes), so nothing here guesses a per-host constant. On the
H100's level1 bench that rest was 3.2 to 8.6 GiB over 16 tasks whose structural bytes
ran from 1.4 to 44 GiB (bench/host_estimate.py).
"""

from __future__ import annotations

import gc
import re
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import torch

from pike.evaluate.check import flatten_output
from pike.evaluate.child_setup import import_file
from pike.evaluate.protocol import EXTRA_TRIALS, timed_set_count

_MODULE = "pike_task_size"
# A task that names CUDA may reach it at import or in get_inputs (`.to('cuda')`,
# `set_default_device("cuda")`): a CUDA context made then is GPU work outside the device
# lock's reckoning, which other evaluations' timed windows would see. Such a task is not
# sized; the gate guesses it from the largest, as before.
_CUDA = re.compile(r"cuda", re.IGNORECASE)
# A task that builds real tensors on the meta device (an explicit device='cpu') has
# allocated before the gate admitted it: its answer is no measure of what it will take.
REAL_BYTES_LIMIT = 2**30
SIZE_SECONDS = 30.0


def structural_bytes(inputs: int, outputs: int, params: int, trial_sets: int,
                     timed_sets: int) -> int:
    """What a reference child of a task with these input, output and weight bytes holds
    of them on the host at most: each trial's and timed set's inputs and each trial's
    expected outputs in its scratch, one more of each while it computes, the weights."""
    return (trial_sets + timed_sets + 1) * inputs + (trial_sets + 1) * outputs + params


def structural_for(answer: dict[str, Any], trials: int, input_sets: int) -> int | None:
    """structural_bytes of a child's answer to "size" under the protocol's counts (`trials`
    check trials, `input_sets` in the timing rotation); None where it gave no sizes."""
    sizes = [answer.get(key) for key in ("inputs", "outputs", "params")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        return None
    inputs, outputs, params = sizes
    return structural_bytes(inputs, outputs, params, trials + EXTRA_TRIALS,
                            timed_set_count(input_sets))


def leaf_bytes(obj: Any) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in flatten_output(obj)
               if isinstance(leaf, torch.Tensor))


def on_meta(module_path: str, limit_s: float = SIZE_SECONDS,
            real_limit: int = REAL_BYTES_LIMIT) -> dict[str, Any]:
    """The task at `module_path`, built and run once on the meta device: its inputs',
    outputs' and weights' bytes, or {"error": why} where it cannot be (an op without a
    meta kernel, a value read from a tensor, longer than `limit_s`, or real memory of
    `real_limit` bytes or more taken meanwhile), and not tried where the task's source
    names CUDA. In the reference's child, before its request: it imports the task under a
    name of its own and drops it after."""
    try:
        if _CUDA.search(Path(module_path).read_text(errors="replace")):
            return {"error": "the task names CUDA: its code would reach the GPU before the "
                             "device is held"}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    before = _rss()
    try:
        with _time_limit(limit_s), torch.device("meta"), torch.no_grad():
            module = import_file(module_path, _MODULE)
            init = module.get_init_inputs()
            inputs = module.get_inputs()
            model = module.Model(*init)
            out = model(*inputs)
            sizes = {"inputs": leaf_bytes(list(inputs)), "outputs": leaf_bytes(out),
                     "params": leaf_bytes([*model.parameters(), *model.buffers()])}
        grown = _rss() - before
        if grown >= real_limit:
            return {"error": f"it took {grown / 2**30:.1f} GiB of real memory on the meta "
                             "device"}
        return sizes
    except BaseException as exc:  # task code may raise anything; no answer is an answer
        first = (str(exc).splitlines() or [""])[0][:200]
        return {"error": f"{type(exc).__name__}: {first}"}
    finally:
        sys.modules.pop(_MODULE, None)
        gc.collect()


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


class _TookTooLong(Exception):
    pass


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds` (the child's main thread); a no-op elsewhere."""
    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise _TookTooLong(f"not done in {seconds:.0f} s")

    try:
        previous = signal.signal(signal.SIGALRM, expired)
    except ValueError:  # not the main thread: no limit but the parent's wait
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
