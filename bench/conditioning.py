"""How well conditioned each task is at the evaluator's tolerance: its reference in its
own dtype against the same model in float64, and against itself on inputs changed by one
part in a million. Where most outputs move past the tolerance under either, only a
candidate that runs the reference's own kernels in their order can pass: any other
rounding (torch.compile's fused kernels, another summation order) is `incorrect`
however close to the exact result it is, and the float64 rule of the evaluator (which
rescues a few values) cannot help. It also says where the outputs are the same for
another draw of the task's own inputs: there the check tells no candidate that ignores
its inputs (check.weak_check).

    python bench/conditioning.py TASK_FOLDER [--ids 24,9] [--tag level3-pike]

Each task runs in a process of its own, held to 80% of the host's available memory.
Runs on the CPU (no GPU needed: the question is the task's arithmetic, not a card's).
Writes bench/results/conditioning-TAG.md and .json (host, torch version, date, command).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from common import RESULTS, device_name, now, this_command, with_ext

from pike.evaluate.check import tensor_leaves
from pike.evaluate.child_setup import import_file

ATOL = RTOL = 1e-2
NUDGE = 1e-6


def _beyond(got: Any, expected: Any) -> tuple[float, float]:
    """The largest |got - expected| in tolerances and the share of values past one."""
    worst, past, count = 0.0, 0, 0
    for g, e in zip(tensor_leaves(got), tensor_leaves(expected), strict=True):
        if not e.is_floating_point():
            continue
        g, e = g.double(), e.double()
        units = (g - e).abs() / (ATOL + RTOL * e.abs())
        worst = max(worst, float(units.max()) if units.numel() else 0.0)
        past += int((units > 1).sum())
        count += units.numel()
    return worst, past / count if count else 0.0


def _row(path: Path) -> dict[str, Any]:
    started = time.perf_counter()
    module = import_file(str(path), f"pike_conditioning_{path.stem}")
    torch.manual_seed(0)
    init = module.get_init_inputs()
    model = module.Model(*init)
    torch.manual_seed(1)
    inputs = module.get_inputs()
    nudged = [x * (1 + NUDGE) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
              for x in inputs]
    torch.manual_seed(2)
    other = module.get_inputs()
    with torch.no_grad():
        own = model(*inputs)
        moved = model(*nudged)
        again = model(*other)
        # outputs that ignore the inputs: a check on such a task tells no candidate that
        # ignores them (check.weak_check says so in its verdicts)
        same = all(torch.equal(a, b) for a, b in zip(tensor_leaves(own), tensor_leaves(again),
                                                      strict=True))
        exact = model.double()(*[x.double() if isinstance(x, torch.Tensor)
                                 and x.is_floating_point() else x for x in inputs])
    to_exact, share_exact = _beyond(own, exact)
    to_nudged, share_nudged = _beyond(moved, own)
    return {"task": path.stem, "vs_float64_worst": to_exact, "vs_float64_share": share_exact,
            "nudged_worst": to_nudged, "nudged_share": share_nudged,
            "ill_conditioned": max(share_exact, share_nudged) > 0.5,
            "same_on_another_draw": same,
            "seconds": round(time.perf_counter() - started, 1)}


def _row_apart(path: Path) -> dict[str, Any]:
    """_row in a process of its own whose data segment is held to 80% of the host's
    available memory: a task too large for this host in float64 (level3-pike's
    31_VisionAttention took the 23 GiB host's memory and the whole run with it) is a row
    that says so."""
    limit = int(psutil.virtual_memory().available * 0.8)

    def held() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(
            resource.RLIMIT_DATA)[1]))

    done = subprocess.run([sys.executable, __file__, "--one", str(path)], capture_output=True,
                          text=True, preexec_fn=held, check=False)
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"task": path.stem, "error": f"not run here (over {limit / 2**30:.0f} GiB, or "
                f"failed): {said[:160]}"}


def _one(path: Path) -> None:
    try:
        row = _row(path)
    except Exception as exc:  # a task this host cannot run (a GPU-only op, a package, memory)
        row = {"task": path.stem, "error": f"{type(exc).__name__}: "
               f"{(str(exc).splitlines() or [''])[0][:160]}"}
    print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, nargs="?")
    p.add_argument("--ids", help="only these task ids, e.g. 24,9")
    p.add_argument("--tag", default="tasks")
    p.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # (_row_apart's child)
    args = p.parse_args()
    if args.one is not None:
        _one(args.one)
        return
    if args.folder is None:
        p.error("TASK_FOLDER is required")
    ids = {int(i) for i in args.ids.split(",")} if args.ids else None
    paths = sorted((f for f in args.folder.glob("*.py") if re.match(r"\d+_", f.name)
                    and (ids is None or int(f.name.split("_")[0]) in ids)),
                   key=lambda f: int(f.name.split("_")[0]))
    rows = []
    for path in paths:
        rows.append(_row_apart(path))
        print(json.dumps(rows[-1]), flush=True)
    data = {"host": device_name("cpu"), "torch": torch.__version__, "date": now(),
            "command": this_command(), "atol": ATOL, "rtol": RTOL, "nudge": NUDGE,
            "rows": rows}
    stem = RESULTS / f"conditioning-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2) + "\n")
    ill = [r["task"] for r in rows if r.get("ill_conditioned")]
    same = [r["task"] for r in rows if r.get("same_on_another_draw")]
    run = [r for r in rows if "error" not in r]
    lines = [f"# How well conditioned each task is at the tolerance ({args.tag})", "",
             f"- host: {data['host']} (CPU, float32 against float64); torch {data['torch']}; "
             f"{data['date']}",
             f"- command: `{data['command']}`",
             f"- tolerance: atol = rtol = {ATOL}; a value is past it where |a - b| > atol + "
             "rtol * |b|. Weights seeded 0, inputs seeded 1 (the task's own draw).",
             f"- vs float64: the reference in its dtype against the same weights and inputs "
             f"in float64; nudged: against itself on inputs times (1 + {NUDGE:g})",
             f"- ill-conditioned (over half the values past the tolerance under either): "
             f"**{len(ill)} of the {len(run)} run here**{': ' + ', '.join(ill) if ill else ''}"
             f"{f' ({len(rows) - len(run)} of {len(rows)} not run here)' if len(run) < len(rows) else ''}",
             f"- the same outputs on another draw of the task's own inputs (seed 2), every "
             f"value equal: **{len(same)} of the {len(run)}**"
             f"{': ' + ', '.join(same) if same else ''}", "",
             "| task | vs float64: worst (tolerances) / share past | nudged: worst / share "
             "past | seconds |", "|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['task']} | {r['error']} | | |")
            continue
        lines.append(f"| {r['task']} | {r['vs_float64_worst']:.3g} / "
                     f"{r['vs_float64_share']:.1%} | {r['nudged_worst']:.3g} / "
                     f"{r['nudged_share']:.1%} | {r['seconds']} |")
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
