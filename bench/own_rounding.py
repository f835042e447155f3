"""How often a kept file fails the plain comparison only by the reference's own rounding,
and what the evaluator's float64 rule (pike.evaluate.own_rounding) then says: for each
of N draws of the task's inputs (seeds 1..N, as the trials draw them), the reference and
the file built with the same weights, the values outside atol = rtol = 1e-2, the
reference's and the file's largest distance from a float64 run of the reference (in
tolerances: 1.0 is the edge), and
the rule's verdict on the failing values.

    python bench/own_rounding.py TASK.py FILE.py [--draws 20] [--device cpu] [--tag cpu-14]

The file is run in this process: only for files kept by pike's own benchmarks, never an
untrusted candidate (the evaluator runs those in a sandboxed child). Writes
bench/results/own-rounding-TAG.md and .json (device, torch version, date, command).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, device_name, now, this_command, with_ext

from pike.evaluate import check, own_rounding

ATOL = RTOL = 1e-2


def _load(path: Path, name: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": name}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


def _draw(task: dict[str, Any], kept: dict[str, Any], draws: int, device: str
          ) -> list[dict[str, Any]]:
    on = torch.device(device)
    init = task["get_init_inputs"]()
    torch.manual_seed(0)
    reference = task["Model"](*init).to(device).eval()
    torch.manual_seed(0)
    candidate = kept["ModelNew"](*init).to(device).eval()
    rows = []
    for seed in range(1, draws + 1):
        torch.manual_seed(seed)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x
                  for x in task["get_inputs"]()]
        with torch.no_grad():
            expected = check.flatten_output(reference(*inputs))
            got = check.flatten_output(candidate(*inputs))
        exact = own_rounding.exact_forward(reference, inputs)
        plain = [check.compare_leaf(e, g, 0, i, ATOL, RTOL, on)
                 for i, (e, g) in enumerate(zip(expected, got, strict=True))]
        failing = sum(m.mismatched or 0 for m in plain if m.problem)
        verdict = "ok"
        if any(m.problem for m in plain):
            why = own_rounding.rescued(expected, got, lambda x=exact: x, ATOL, RTOL, on)
            verdict = "ok by the float64 rule" if why is None else f"incorrect: {why}"
        rows.append({
            "seed": seed, "values_failing_plain": failing, "verdict": verdict,
            "reference_from_float64": _largest(expected, exact),
            "file_from_float64": _largest(got, exact)})
    return rows


def _largest(leaves: list[Any], exact: list[Any]) -> float:
    """The largest distance from the float64 run, in tolerances (1.0 is the edge)."""
    return max((float(((a.double() - x).abs() / (ATOL + RTOL * x.abs())).max())
                for a, x in zip(leaves, exact, strict=False)
                if isinstance(a, torch.Tensor) and a.is_floating_point()), default=0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", type=Path)
    p.add_argument("file", type=Path)
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tag", default="cpu")
    args = p.parse_args()
    torch.set_float32_matmul_precision("highest")  # the evaluator's trials' setting
    rows = _draw(_load(args.task, "pike_task"), _load(args.file, "pike_kept_file"),
                 args.draws, args.device)
    data = {"device": device_name(args.device), "torch": torch.__version__, "date": now(),
            "command": this_command(), "task": args.task.stem, "rows": rows}
    stem = RESULTS / f"own-rounding-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2) + "\n")
    failed = [r for r in rows if r["values_failing_plain"]]
    lines = [f"# {args.task.stem}: the plain comparison and the float64 rule ({args.tag})", "",
             f"- device: {data['device']}; torch {data['torch']}; {data['date']}",
             f"- command: `{data['command']}`",
             f"- {len(failed)} of {len(rows)} draws fail the plain comparison (atol = rtol = "
             "0.01); the float64 rule passes "
             f"{sum(r['verdict'] == 'ok by the float64 rule' for r in failed)} of them", "",
             "| seed | values failing plain | reference from float64 (tolerances) | file from "
             "float64 (tolerances) | "
             "verdict |", "|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['values_failing_plain']} | "
              f"{r['reference_from_float64']:.3g} | {r['file_from_float64']:.3g} | "
              f"{r['verdict']} |" for r in rows]
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
