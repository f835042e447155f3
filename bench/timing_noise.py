"""Where does run-to-run timing noise come from? Block medians within and across processes.

    python bench/timing_noise.py TASK_FILE [--blocks 4] [--gap 1] [--procs 3]
        [--warmup-seconds 0.05] [--min-seconds 0.3] [--pin CPU]

Each process builds the task's model on CUDA and times `blocks` blocks of calls under
pike's protocol, sleeping `gap` seconds between blocks (as the GPU idles between
evaluations). Prints one JSON line per process: for each block the median, minimum and
90th percentile of the calls, the CPU the process ran on and the GPU SM clock. Spread
within a process points at the GPU or the host's load; spread only across processes
points at per-process state (core placement, allocator, library heuristics).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from common import run_script


def _current_cpu() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def _sm_clock() -> int | None:
    try:
        return torch.cuda.clock_rate()
    except Exception:
        return None


def one_process(a: argparse.Namespace) -> None:
    from pike.config import TimingConfig
    from pike.evaluate.timing import time_calls
    from pike.task import Task

    ns: dict = {}
    exec(compile(Task.from_file(a.task).source, a.task, "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    cfg = TimingConfig(min_seconds=a.min_seconds, warmup_seconds=a.warmup_seconds,
                       max_calls=100000)
    rows = []
    for _ in range(a.blocks):
        time.sleep(a.gap)
        clock_before = _sm_clock()
        with torch.no_grad():
            samples = sorted(time_calls(lambda: model(*inputs), torch.device("cuda"), cfg))
        rows.append({"median": round(statistics.median(samples), 4),
                     "min": round(samples[0], 4),
                     "p90": round(samples[int(0.9 * (len(samples) - 1))], 4),
                     "n": len(samples), "cpu": _current_cpu(), "clock": clock_before,
                     "clock_after": _sm_clock()})
    print(json.dumps(rows))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("task")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--gap", type=float, default=1.0)
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=0.3)
    p.add_argument("--warmup-seconds", type=float, default=0.05)
    p.add_argument("--pin", type=int, default=None, help="run each process on this CPU")
    p.add_argument("--child", action="store_true")
    a = p.parse_args()
    if a.child:
        if a.pin is not None:
            os.sched_setaffinity(0, {a.pin})
        one_process(a)
        return
    label = (f"{os.path.basename(a.task)} warmup={a.warmup_seconds}s "
             f"min={a.min_seconds}s pin={a.pin}")
    all_medians = []
    for i in range(a.procs):
        cmd = [sys.executable, __file__, a.task, "--child", "--blocks", str(a.blocks),
               "--gap", str(a.gap), "--min-seconds", str(a.min_seconds),
               "--warmup-seconds", str(a.warmup_seconds)]
        if a.pin is not None:
            cmd += ["--pin", str(a.pin)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(label, f"process {i} failed:", out.stderr[-500:])
            continue
        rows = json.loads(out.stdout.strip().splitlines()[-1])
        all_medians += [r["median"] for r in rows]
        print(label, f"process {i}:", json.dumps(rows))
    if len(all_medians) > 1:
        cv = statistics.stdev(all_medians) / statistics.fmean(all_medians)
        print(label, f"ALL blocks: CV of medians {cv:.2%} range "
              f"{min(all_medians):.4f}-{max(all_medians):.4f} ms")


if __name__ == "__main__":
    run_script(main)
