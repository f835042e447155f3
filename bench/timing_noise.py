"""Where does run-to-run timing noise come from? Block medians within and across processes.

    python bench/timing_noise.py TASK_FILE [--blocks 8] [--gap 2] [--procs 4]

Each process builds the task's model on CUDA and times `blocks` blocks of calls under
pike's protocol, sleeping `gap` seconds between blocks (as the GPU idles between
evaluations). Prints the median of each block, and the GPU's SM clock before each block.
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


def one_process(task_file: str, blocks: int, gap: float, min_seconds: float,
                warmup_s: float) -> None:
    from pike.config import TimingConfig
    from pike.evaluate.timing import time_calls
    from pike.task import Task

    ns: dict = {}
    exec(compile(Task.from_file(task_file).source, task_file, "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).cuda()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    cfg = TimingConfig(min_seconds=min_seconds, warmup_seconds=warmup_s)
    rows = []
    for _ in range(blocks):
        time.sleep(gap)
        clock = torch.cuda.clock_rate() if hasattr(torch.cuda, "clock_rate") else None
        with torch.no_grad():
            samples = time_calls(lambda: model(*inputs), torch.device("cuda"), cfg)
        rows.append({"median": statistics.median(samples), "n": len(samples), "clock": clock,
                     "cpu": os.sched_getaffinity(0).__len__()})
    print(json.dumps(rows))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("task")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--gap", type=float, default=2.0)
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=0.3)
    p.add_argument("--warmup-seconds", type=float, default=0.05)
    p.add_argument("--child", action="store_true")
    a = p.parse_args()
    if a.child:
        one_process(a.task, a.blocks, a.gap, a.min_seconds, a.warmup_seconds)
        return
    for i in range(a.procs):
        out = subprocess.run([sys.executable, __file__, a.task, "--child", "--blocks",
                              str(a.blocks), "--gap", str(a.gap), "--min-seconds",
                              str(a.min_seconds), "--warmup-seconds", str(a.warmup_seconds)],
                             capture_output=True, text=True)
        rows = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []
        print(f"process {i}: medians ms", [round(r["median"], 4) for r in rows],
              "clocks", [r["clock"] for r in rows], out.stderr[-300:] if out.returncode else "")


if __name__ == "__main__":
    main()
