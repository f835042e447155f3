"""tf32x3 (large fp32 matrix products as three TF32 ones) on tasks' matrix products: does
it stay correct where plain TF32 does not, and what is it worth.

    python bench/tf32x3.py KB/level1 --ids 2,8,13,17 --emulate --tag cpu-emulated
    python bench/tf32x3.py KB/level1 --ids 2,8,13,17 --device cuda --tag h100

`--emulate` (any host): precision alone, with TF32 emulated as tensor cores take it (each
operand's low 13 mantissa bits cut, products accumulated in fp32). Each task's inputs are
drawn by its get_inputs() under a seed, as they are and with the evaluator's two other
distributions (ShiftSpec 'affine' and 'uniform'); each product of its forward is measured
on its first 64 rows (every output value's error depends only on its row and column)
against float64: the largest error, in tolerances (atol = rtol = 0.01; 1.0 is the edge;
the evaluator's shifted trial allows more) for fp32, TF32 and tf32x3.

Without `--emulate` (a GPU): each task's `tf32` and `tf32x3` offline candidates judged by
the evaluator, one at a time: verdict, speedup over eager, largest errors.

Writes bench/results/tf32x3-TAG.md and .json (device, torch version, date, command).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, device_name, now, run_script, this_command, with_ext

from pike.agents.offline import render
from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.evaluate.child_setup import _shift_distribution
from pike.evaluate.protocol import ShiftSpec
from pike.task import Task

ATOL = RTOL = 0.01
ROWS = 64
DISTRIBUTIONS: dict[str, ShiftSpec | None] = {
    "as drawn": None,
    "affine x3.25+0.5": ShiftSpec(kind="affine", scale=3.25, offset=0.5, seed=1),
    "uniform 3x3.25 about 0.5": ShiftSpec(kind="uniform", scale=3.25, offset=0.5, seed=1),
}


def _cut(x: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int32) & -8192).view(torch.float32)


def _emulated(product: Any, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """The product in fp32, in emulated TF32 and as tf32x3 would compute it."""
    a_hi, b_hi = _cut(a), _cut(b)
    a_lo, b_lo = a - a_hi, b - b_hi
    small = product(a_hi, _cut(b_lo)) + product(_cut(a_lo), b_hi)
    return {"fp32": product(a, b), "tf32": product(a_hi, b_hi),
            "tf32x3": product(a_hi, b_hi) + small}


class _Measuring(torch.overrides.TorchFunctionMode):
    """Each fp32 product of a forward measured on its first rows; the forward goes on with
    the product as written."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[str, float] = {"fp32": 0.0, "tf32": 0.0, "tf32x3": 0.0}
        self.products = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        linear = func is torch.nn.functional.linear
        if func not in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
                        torch.Tensor.mm, torch.bmm, torch.Tensor.bmm) and not linear:
            return out
        a, b = args[0], args[1]
        if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() >= 2
                   for t in (a, b)):
            return out
        self.products += 1
        if linear:
            a, b, product = a.reshape(-1, a.shape[-1])[:ROWS], b.T, torch.matmul
        else:
            a, product = a[..., :ROWS, :], torch.matmul
            if a.dim() > 2:  # two of the batch
                a = a.reshape(-1, *a.shape[-2:])[:2]
                b = b.reshape(-1, *b.shape[-2:])[:2] if b.dim() > 2 else b
        exact = product(a.double(), b.double())
        room = ATOL + RTOL * exact.abs()
        for name, got in _emulated(product, a, b).items():
            self.errors[name] = max(self.errors[name],
                                    float(((got.double() - exact).abs() / room).max()))
        return out


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("pike_bench_task", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def emulate(path: Path) -> list[dict[str, Any]]:
    module = _load(path)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    rows = []
    for name, spec in DISTRIBUTIONS.items():
        torch.manual_seed(1)
        inputs = [_shift_distribution(x, spec) for x in module.get_inputs()]
        measuring = _Measuring()
        with torch.no_grad(), measuring:
            model(*inputs)
        rows.append({"task": path.stem, "inputs": name, "products": measuring.products,
                     **{f"{k} (tolerances)": v for k, v in measuring.errors.items()}})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def judge(path: Path, device: str) -> list[dict[str, Any]]:
    task = Task.from_file(path)
    rows = []
    for names in (("tf32",), ("tf32x3",)):
        verdict = evaluate(task, render(task.source, names), EvalConfig(device=device))
        rows.append({"task": path.stem, "candidate": " + ".join(names),
                     "status": verdict.status, "speedup": verdict.speedup,
                     "max_abs_error": verdict.max_abs_error,
                     "max_rel_error": verdict.max_rel_error,
                     "message": (verdict.message or "").splitlines()[0][:200]
                     if verdict.message else ""})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _table(rows: list[dict[str, Any]]) -> list[str]:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a folder of task files (KernelBench's level1)")
    p.add_argument("--ids", required=True, help="task ids: 2,8,13,17")
    p.add_argument("--emulate", action="store_true", help="precision alone, TF32 emulated")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tag", required=True)
    args = p.parse_args()
    torch.set_float32_matmul_precision("highest")
    paths = [next(args.folder.glob(f"{i}_*.py")) for i in args.ids.split(",")]
    rows = [r for path in paths
            for r in (emulate(path) if args.emulate else judge(path, args.device))]
    device = "cpu (TF32 emulated)" if args.emulate else device_name(args.device)
    data = {"benchmark": "tf32x3", "device": device, "torch": torch.__version__,
            "date": now(), "command": this_command(), "rows": rows}
    stem = RESULTS / f"tf32x3-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2) + "\n")
    what = ("largest error against float64 over the first 64 rows of each product, in "
            "tolerances (atol = rtol = 0.01)" if args.emulate
            else "each candidate judged alone by the evaluator (default protocol)")
    lines = [f"# tf32x3 on {args.folder.name} ({args.tag})", "",
             f"- device: {device}; torch {data['torch']}; {data['date']}",
             f"- command: `{data['command']}`", f"- {what}", "", *_table(rows)]
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    run_script(main)
