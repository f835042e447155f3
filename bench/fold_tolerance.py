"""How close `fold_linear_sum` stays to eager, against the evaluator's tolerance: for each
task file given, the reference and its fold built with the same weights, on the task's own
inputs and on inputs four times larger and shifted (as the shifted trial draws them), the
largest |folded - eager| / (atol + rtol * |eager|) (1.0 is the tolerance's edge).

    python bench/fold_tolerance.py TASK.py [TASK.py ...] [--device cpu] [--tag cpu]

Writes bench/results/fold-tolerance-TAG.md and .json (device, torch version, date, command).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, device_name, now, this_command, with_ext

from pike.agents.offline import render

ATOL = RTOL = 1e-2


def _margins(path: Path, device: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "pike_fold_bench"}
    exec(compile(render(path.read_text(), ("fold_linear_sum",)), str(path), "exec"), ns)
    init = ns["get_init_inputs"]()
    torch.manual_seed(0)
    reference = ns["Model"](*init).to(device)
    torch.manual_seed(0)
    folded = ns["ModelNew"](*init).to(device)
    row: dict[str, Any] = {"task": path.stem, "sums_folded": folded.sums_folded}
    torch.manual_seed(1)
    own = [x.to(device) for x in ns["get_inputs"]()]
    for name, inputs in (("own", own), ("shifted", [x * 4.0 - 1.0 for x in own])):
        with torch.no_grad():
            expected, got = reference(*inputs), folded(*inputs)
        share = ((got - expected).abs() / (ATOL + RTOL * expected.abs())).max()
        row[f"{name}_worst_share_of_tolerance"] = float(share)
        row[f"{name}_max_abs_error"] = float((got - expected).abs().max())
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tasks", nargs="+", type=Path)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tag", default="cpu")
    args = p.parse_args()
    rows = [_margins(path, args.device) for path in args.tasks]
    data = {"device": device_name(args.device), "torch": torch.__version__, "date": now(),
            "command": this_command(), "rows": rows}
    stem = RESULTS / f"fold-tolerance-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [f"# fold_linear_sum against eager, as a share of the tolerance ({args.tag})", "",
             f"- device: {data['device']}; torch {data['torch']}; {data['date']}",
             f"- command: `{data['command']}`",
             "- share: the largest |folded - eager| / (atol + rtol * |eager|), atol = rtol = "
             "0.01 (1.0 is the edge); shifted: the task's inputs * 4 - 1", "",
             "| task | sums folded | own inputs: share / max abs error | shifted: share / "
             "max abs error |", "|---|---|---|---|"]
    lines += [f"| {r['task']} | {r['sums_folded']} | {r['own_worst_share_of_tolerance']:.4f}"
              f" / {r['own_max_abs_error']:.3g} | {r['shifted_worst_share_of_tolerance']:.4f}"
              f" / {r['shifted_max_abs_error']:.3g} |" for r in rows]
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
