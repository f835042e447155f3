"""A run's confirming window, timed again, against its candidates each in a window of its own.

On the H200 level2 bench (bench-level2-h200-ledger) 17_Conv2d_InstanceNorm_Divide's
confirming window gave its max-autotune candidates 1.40 to 1.68x over eager, where the same
candidate judged alone by `pike eval` gave 2.05x (results/confirm-gap-17-h200/). This
times, for one task of a run store, the candidates its confirming window took:
  - together: all of them and eager in one window, as the run did (evaluate/confirm.py);
  - together, no timing cores: the same with `eval.timing_cores` 0, so no timed child
    moves onto the GPU's few timing cores beside the others' threads;
  - alone: each with eager in a window of its own.
Each figure comes with its wall-clock factor (the raise of its times by the parent's
clock) and beside the search's own figure. Nothing else runs on the device meanwhile.

    python bench/confirm_gap.py RUN_DIR TASKS_DIR --task NAME [--device cuda] [--tag t]
        [--variants together,alone]

Writes bench/results/confirm-gap-<tag>.json and .md with device, torch version, date and
the command, again after each variant (a device call's limit cut the first run on the H200
in its third variant, and the two it had finished were in its log only).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, device_name, now, run_script, this_command, with_ext

from pike.config import EvalConfig, RunConfig
from pike.evaluate.confirm import Confirmation, confirm
from pike.store import RunStore
from pike.task import Task

VARIANTS = ("together", "together, no timing cores", "alone")


def confirmed_sources(store: RunStore, task: str) -> tuple[dict[int, str], dict[int, float]]:
    """The sources of the candidates the run's confirming window took, and their search
    figures; an error where the run confirmed none for `task`."""
    kept = store.get_state(task, "confirmed")
    if not isinstance(kept, dict) or not kept.get("candidates"):
        raise SystemExit(f"{task}: the run has no confirming window for this task")
    rows = {r.id: r for r in store.candidates(task)}
    ids = [i for i in kept["candidates"] if i in rows]
    return ({i: rows[i].source for i in ids},
            {i: (rows[i].verdict.speedup if rows[i].verdict else None) or 0.0 for i in ids})


def time_variants(task: Task, sources: dict[int, str], base: EvalConfig,
                  variants: tuple[str, ...] = VARIANTS,
                  done: Callable[[dict[str, list[dict[str, Any]]]], None] | None = None,
                  ) -> dict[str, list[dict[str, Any]]]:
    """Each variant's confirmations (as dicts), fastest first, on `base` (the run's
    protocol: a confirming window's is the default one); `done` gets what is timed so far
    after each variant, so a call cut off by its limit keeps the variants it finished."""
    out: dict[str, list[dict[str, Any]]] = {}
    for variant in variants:
        cfg = base.model_copy(deep=True)
        if variant == "together, no timing cores":
            cfg.timing_cores = 0
        if variant == "alone":
            found: list[Confirmation] = []
            for cid, source in sources.items():
                found += confirm(task, {cid: source}, cfg)
        else:
            found = confirm(task, sources, cfg)
        out[variant] = [c.model_dump() for c in found]
        print(f"{variant}: " + ", ".join(_figure(c.model_dump()) for c in found), flush=True)
        if done is not None:
            done(out)
    return out


def _figure(c: dict[str, Any]) -> str:
    if c.get("speedup") is None:
        why = (c.get("caught") or c.get("error") or "").strip().splitlines()
        return f"{c['candidate_id']} failed" + (f" ({why[-1][:160]})" if why else "")
    raised = f" (raised {c['wall_clock_factor']:.2f}x)" if c.get("wall_clock_factor") else ""
    return f"{c['candidate_id']} {c['speedup']:.2f}x{raised}"


def render(data: dict[str, Any]) -> str:
    head = [f"# The confirming window of {data['task']}, again and one by one", "",
            f"- device: {data['device_name']} ({data['device']}), torch "
            f"{data['torch_version']}, {data['date']}",
            f"- command: `{data['command']}`",
            f"- run: `{data['run']}`; each cell: speedup over eager in that window, with the "
            "factor its times were raised by where they were (the parent's clock)", ""]
    found = {variant: {str(c["candidate_id"]): c for c in data["variants"].get(variant, [])}
             for variant in VARIANTS}
    rows = ["| candidate | idea | search | " + " | ".join(VARIANTS) + " |",
            "|---|---|---|" + "---|" * len(VARIANTS)]
    for cid in data["search"]:
        cells = []
        for variant in VARIANTS:
            c = found[variant].get(cid)
            cells.append("-" if c is None else _figure(c).split(" ", 1)[1])
        rows.append(f"| {cid} | {data['ideas'].get(cid, '')} | "
                    f"{data['search'][cid]:.2f}x | " + " | ".join(cells) + " |")
    return "\n".join(head + rows) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("tasks_dir", type=Path)
    p.add_argument("--task", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="which to time, comma-separated, in this order (default: all)")
    args = p.parse_args()
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    if unknown := set(variants) - set(VARIANTS):
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    store = RunStore.open(args.run_dir)
    sources, search = confirmed_sources(store, args.task)
    ideas = {str(r.id): r.idea or "" for r in store.candidates(args.task)}
    task = Task.from_file(args.tasks_dir / f"{args.task}.py")
    base = RunConfig().eval
    base.device = args.device
    data = {"benchmark": "confirm_gap", "task": args.task, "run": str(args.run_dir),
            "device": args.device, "device_name": device_name(args.device),
            "torch_version": torch.__version__, "date": now(), "command": this_command(),
            "search": {str(i): s for i, s in search.items()},
            "ideas": {i: ideas.get(i, "") for i in map(str, sources)}, "variants": {}}
    stem = args.out / f"confirm-gap-{args.tag or args.task.split('_')[0]}"

    def save(variants_so_far: dict[str, list[dict[str, Any]]]) -> None:
        data["variants"] = variants_so_far
        with_ext(stem, ".json").write_text(json.dumps(data, indent=1))
        with_ext(stem, ".md").write_text(render(data))

    time_variants(task, sources, base, variants, done=save)
    print(f"wrote {with_ext(stem, '.md')}")
    return 0


if __name__ == "__main__":
    run_script(main)
