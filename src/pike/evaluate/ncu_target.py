"""What Nsight Compute runs: build a module's model and call it, so `ncu` profiles its kernels.

    python -m pike.evaluate.ncu_target TASK MODULE [--device cuda:0] [--calls 2] [--seed 42]
        [--eval] [--construct-on cpu|device] [--file-bytes-limit N]

TASK gives get_init_inputs and get_inputs; MODULE (the task itself for the reference)
gives ModelNew, or else Model. Weights and inputs are seeded as the evaluator seeds them.
A first call, outside the profiled range, does the lazy work (extension builds, Triton
autotuning, allocator growth); only the calls after it run inside the NVTX range that
evaluate/ncu.py tells ncu to profile. The evaluator started this process in a scrubbed
environment; it never reads anything back from it but ncu's report. With
--file-bytes-limit it confines itself as a judged child does (no file past N bytes, the
system-call filter) before the module's code loads.
"""

from __future__ import annotations

import argparse
import sys

from pike.config import CONSTRUCT_ON

NVTX_RANGE = "pike"


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pike.evaluate.ncu_target")
    parser.add_argument("task")
    parser.add_argument("module")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--eval", action="store_true", help="call .eval() on the model")
    parser.add_argument("--construct-on", choices=CONSTRUCT_ON, default="auto")
    parser.add_argument("--file-bytes-limit", type=int, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    if args.file_bytes_limit:  # before the task's or the module's code, as in runner.main
        from pike.evaluate.syscall_filter import confine

        said = confine(args.file_bytes_limit)
        if said != "on":  # into ncu's log, which a failed run's note quotes
            print(f"pike: system-call filter {said}", file=sys.stderr)

    import torch

    from pike.evaluate.child_setup import construct, import_file, resolve_construct_on, trial_seed

    # Two modules, as in the evaluator: a candidate never sees the reference's namespace.
    task = import_file(args.task, "pike_ncu_task")
    device = torch.device(args.device)
    init_inputs = list(task.get_init_inputs())
    # the task's class decides, as in the evaluator, where a candidate's model is built:
    # before the candidate's module is imported, so it has no say
    where = resolve_construct_on(args.construct_on, task.Model, init_inputs, device)
    module = task if args.module == args.task else import_file(args.module, "pike_ncu_module")
    cls = getattr(module, "ModelNew", None) or module.Model
    torch.manual_seed(args.seed)
    model = construct(cls, init_inputs, device, where).to(device)
    if args.eval:
        model = model.eval()
    torch.manual_seed(trial_seed(args.seed, 0))
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize(device)
        torch.cuda.nvtx.range_push(NVTX_RANGE)
        for _ in range(args.calls):
            model(*inputs)
        torch.cuda.synchronize(device)
        torch.cuda.nvtx.range_pop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
