"""A task's size before it runs: its inputs, outputs and weights in bytes, found on the
meta device, and what a reference child of it is expected to hold on the host.

The host-memory gate (host_memory) admits a reference child only where the host has room
for what its task's children take. A task nobody had measured was expected at the largest
size any task took: on the H100's level1 bench, 50.9 GiB (42_Max_Pooling_2D) for each new
task, and a 10 GiB matmul's reference waited 300 s behind it. The parent never runs task
code, so the reference's child, already started and waiting for its request, is asked
first (the "size" event): in a process forked from it for the purpose (so the task's
module-level effects, a torch.library registration or a default device, stay out of
the reference's own import), with its data segment held to REAL_BYTES_LIMIT beyond what
it had and killed past SIZE_SECONDS, it runs the task's get_init_inputs, get_inputs,
Model and one forward under `torch.device("meta")`, which allocates nothing, and answers
with the bytes it saw.

What a reference holds follows from the protocol (reference_role): every check trial's
and timed set's inputs as files in its scratch, every check trial's expected outputs
(host memory where the scratch is in memory, /dev/shm), the timed sets' inputs again
where the device is the CPU, one set of inputs and one output while it computes, and
the weights. That is `structural_bytes`. The rest (torch, the CUDA context, a baseline's compile workers) is
the host's, not the task's: the gate learns it from the tasks it measured (the most any
took beyond its structural bytes), so nothing here guesses a per-host constant. On the
H100's level1 bench that rest was 3.2 to 8.6 GiB over 16 tasks whose structural bytes
ran from 1.4 to 44 GiB (bench/host_estimate.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import select
import signal
import time
from pathlib import Path
from typing import Any

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
# A task that builds real tensors on the meta device (an explicit device='cpu', numpy)
# would take memory before the gate admitted it: the sizing process's data segment is
# held to this much beyond what it had, and the task is not sized past it.
REAL_BYTES_LIMIT = 2**30
SIZE_SECONDS = 30.0
_ANSWER_LIMIT = 2**16


def structural_bytes(inputs: int, outputs: int, params: int, trial_sets: int,
                     timed_sets: int, files_in_memory: bool = True,
                     on_cpu: bool = False) -> int:
    """What a reference child of a task with these input, output and weight bytes holds
    of them in the host's memory at most: each trial's and timed set's inputs and each
    trial's expected outputs in its scratch (where that is in memory), the timed sets'
    inputs again where its device is the CPU, one more of each while it computes, and
    the weights."""
    files = (trial_sets + timed_sets) * inputs + trial_sets * outputs if files_in_memory else 0
    return files + (timed_sets * inputs if on_cpu else 0) + inputs + outputs + params


def structural_for(answer: dict[str, Any], trials: int, input_sets: int,
                   files_in_memory: bool = True, on_cpu: bool = False) -> int | None:
    """structural_bytes of a child's answer to "size" under the protocol's counts (`trials`
    check trials, `input_sets` in the timing rotation); None where it gave no sizes."""
    sizes = [answer.get(key) for key in ("inputs", "outputs", "params")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        return None
    inputs, outputs, params = sizes
    return structural_bytes(inputs, outputs, params, trials + EXTRA_TRIALS,
                            timed_set_count(input_sets), files_in_memory, on_cpu)


def leaf_bytes(obj: Any) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in flatten_output(obj)
               if isinstance(leaf, torch.Tensor))


def on_meta(module_path: str, limit_s: float = SIZE_SECONDS,
            real_limit: int = REAL_BYTES_LIMIT) -> dict[str, Any]:
    """The task at `module_path`, built and run once on the meta device: its inputs',
    outputs' and weights' bytes, or {"error": why} where it cannot be (an op without a
    meta kernel, a value read from a tensor, longer than `limit_s`, or real memory past
    `real_limit` bytes), and not tried where the task's source names CUDA. Run in a
    process forked for it, which this one waits for (and kills at the limit, with what it
    started): nothing the task's code does reaches the caller. The caller should be
    single-threaded (the reference's child before its request is): a lock another thread
    held at the fork would cost the limit's wait."""
    try:
        if _CUDA.search(Path(module_path).read_text(errors="replace")):
            return {"error": "the task names CUDA: its code would reach the GPU before the "
                             "device is held"}
    except OSError as exc:
        return _error(exc)
    parent = os.getpid()
    try:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
    except OSError as exc:  # no process to spare (a host short of memory): no size
        return _error(exc)
    if pid == 0:  # the sizing process: answers on the pipe and exits, whatever happens
        try:
            os.setpgid(0, 0)  # its own group: whatever it starts is ended with it
            os.close(read_fd)
            _die_with(parent)
            try:
                answer = _measured_here(module_path, real_limit)
            except BaseException as exc:  # task code may raise anything, SystemExit too
                answer = _error(exc)
            data = (json.dumps(answer, default=str) + "\n").encode()[:_ANSWER_LIMIT]
            while data:
                data = data[os.write(write_fd, data):]
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        data = _read_line(read_fd, time.monotonic() + limit_s)
    finally:
        os.close(read_fd)
        _end(pid)
    if data is None:
        return {"error": f"not done in {limit_s:g} s"}
    try:
        answer = json.loads(data)
    except ValueError:
        return {"error": "the sizing process ended without an answer"}
    return answer if isinstance(answer, dict) else {"error": "a malformed answer"}


def _measured_here(module_path: str, real_limit: int) -> dict[str, Any]:
    torch.set_num_threads(1)  # no thread pool made again after the fork: nothing to compute
    _hold_data_segment(real_limit)
    try:
        with torch.device("meta"), torch.no_grad():
            module = import_file(module_path, _MODULE)
            init = module.get_init_inputs()
            inputs = module.get_inputs()
            model = module.Model(*init)
            out = model(*inputs)
            return {"inputs": leaf_bytes(list(inputs)), "outputs": leaf_bytes(out),
                    "params": leaf_bytes([*model.parameters(), *model.buffers()])}
    except MemoryError:
        return _real_memory(real_limit)
    except RuntimeError as exc:
        if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower():
            return _real_memory(real_limit)
        raise


def _real_memory(limit: int) -> dict[str, Any]:
    return {"error": f"it took real memory on the meta device, over {limit / 2**30:.1f} GiB"}


def _error(exc: BaseException) -> dict[str, Any]:
    try:
        first = (str(exc).splitlines() or [""])[0][:200]
    except Exception:  # an exception whose text cannot be had
        first = ""
    return {"error": f"{type(exc).__name__}: {first}"}


def _read_line(fd: int, deadline: float) -> bytes | None:
    """The first line on `fd` (all that came, where its writers closed it before one
    ended); None at `deadline`. Not read to the end: a process the task started may hold
    the pipe open after the answer."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk
    return data.split(b"\n", 1)[0]


def _end(pid: int) -> None:
    """End the sizing process and its group (what it started), done or not."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _hold_data_segment(extra: int) -> None:
    """Allocations past `extra` bytes beyond the data segment now fail (RLIMIT_DATA counts
    private writable mappings too, so large tensors, since Linux 4.7)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            now = next(int(line.split()[1]) * 1024 for line in status
                       if line.startswith("VmData:"))
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = now + extra if hard == resource.RLIM_INFINITY else min(hard, now + extra)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    except (OSError, ValueError, StopIteration):
        pass  # a host without the limit: the parent's wait still bounds it


def _die_with(parent: int) -> None:
    """SIGKILL when `parent` ends; at once where it ended before the wish was made."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)
