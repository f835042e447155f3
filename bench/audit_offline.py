"""Audit a solution set pike produced: the offline strategy's best per task, and a copy of
it with three files broken on purpose, so the audit's verdicts can be checked by eye.

    python bench/audit_offline.py OFFLINE_RESULTS_JSON TASK_FOLDER [--device cuda]
        [--modes default,reduce-overhead] [--workers 4] [--tag level3-pike] [--work DIR]
        [--out DIR]

The set is rebuilt from an offline benchmark's results (bench/offline.py records the best
transformation set of each task; the offline agent renders the same source from it), so
no candidate source has to travel between machines. The broken copy changes the first
three files in task order: one returns a slightly wrong output, one raises in forward,
one is wrong only on some inputs. That last one is keyed on an element of the first input
chosen from the evaluator's own trial inputs (at most the median on the first trial, above
it on a later one), so the audit must call it seed-dependent: the first trial passes and
a later one fails. Both sets go through `pike.audit.audit` with the full guards. Writes
bench/results/audit-<tag>.json/.md and audit-<tag>-broken.json/.md (the AuditResult plus
the command), each with device, torch version and date.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from common import RESULTS, apply_modes, device_name, modes_argument, run_script
from offline_set import rendered_best

from pike.audit import audit, to_markdown
from pike.config import EvalConfig, RunConfig
from pike.evaluate.child_setup import import_file, trial_seed
from pike.task import Task

# Appended to a rendered ModelNew: each subclasses it and spoils the result one way.
BREAKS = {
    "wrong": ("class ModelNew(ModelNew):  # broken on purpose: output off by 5%\n"
              "    def forward(self, *args):\n"
              "        return super().forward(*args) * 1.05 + 0.05\n"),
    "crash": ("class ModelNew(ModelNew):  # broken on purpose: raises\n"
              "    def forward(self, *args):\n"
              "        raise RuntimeError('broken on purpose')\n"),
    "seed-dependent": (
        "class ModelNew(ModelNew):  # broken on purpose: wrong on some inputs, not the first\n"
        "    def forward(self, *args):\n"
        "        out = super().forward(*args)\n"
        "        x = args[0].flatten()\n"
        "        return out + 1.0 if bool(x[{index}] > x.median()) else out\n"),
}


# The broken copy's seed-dependent break is tuned to one known seed, as a file fitted to
# one check would be; the audit runs with that seed, so only its fresh trials catch it.
KNOWN_SEED = 42


def seed_dependent_index(task: Task, seed: int, trials: int, scan: int = 4096) -> int | None:
    """An element of the first input that is at most the median on the first trial and
    above it on a later one; None when the first input is not a float tensor or no such
    element is among the first `scan` (the task file is trusted: it is the reference)."""
    module = import_file(str(task.path), f"pike_audit_bench_{task.name}")
    above = []
    for trial in range(trials):
        torch.manual_seed(trial_seed(seed, trial))
        x = module.get_inputs()[0]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return None
        flat = x.detach().flatten()
        above.append(flat[:scan] > flat.median())
    later = torch.stack(above[1:]).any(dim=0) if len(above) > 1 else None
    if later is None:
        return None
    hits = torch.nonzero(~above[0] & later)
    return int(hits[0]) if len(hits) else None


def build_sets(results: dict, tasks_dir: Path, work: Path,
               cfg: EvalConfig) -> tuple[Path, Path, dict]:
    """The set and its broken copy under `work`; which task got which break."""
    good, broken = work / "offline-set", work / "offline-set-broken"
    good.mkdir(parents=True, exist_ok=True)
    broken.mkdir(parents=True, exist_ok=True)
    breaks: dict[str, str] = {}
    for task, _, source in rendered_best(results, tasks_dir):
        if source is None:
            continue
        (good / f"{task.name}.py").write_text(source)
        kind = list(BREAKS)[len(breaks)] if len(breaks) < len(BREAKS) else None
        spoiler = BREAKS.get(kind or "", "")
        if kind == "seed-dependent":
            index = seed_dependent_index(task, KNOWN_SEED, cfg.trials)
            # without such an element this task stays intact and the next one is tried
            kind, spoiler = (kind, spoiler.replace("{index}", str(index))) if index is not None \
                else (None, "")
        if kind:
            breaks[task.name] = kind
            source = source + "\n\n" + spoiler
        (broken / f"{task.name}.py").write_text(source)
    return good, broken, breaks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("offline_results", type=Path)
    p.add_argument("folder", type=Path)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    modes_argument(p)
    p.add_argument("--sets", choices=("both", "good", "broken"), default="both",
                   help="which set to audit (two processes may audit one each at once: "
                        "the evaluator's device lock keeps their timing apart)")
    p.add_argument("--workers", type=int, default=1, help="tasks audited at once")
    p.add_argument("--tag", default="offline")
    p.add_argument("--work", type=Path, default=None, help="where the sets and stores go")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    results = json.loads(args.offline_results.read_text())
    cfg = RunConfig()
    cfg.eval.device = args.device
    cfg.eval.workers = args.workers
    cfg.eval.seed = KNOWN_SEED
    apply_modes(args, cfg)
    work = args.work or Path(tempfile.mkdtemp(prefix="pike-audit-"))
    good, broken, breaks = build_sets(results, args.folder, work, cfg.eval)
    print(f"sets under {work}; broken on purpose: {breaks}", flush=True)
    command = "python " + " ".join(sys.argv)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [(args.tag, good)] if args.sets != "broken" else []
    chosen += [(f"{args.tag}-broken", broken)] if args.sets != "good" else []
    for name, folder in chosen:
        result = audit(folder, args.folder, cfg, out=work / f"run-{name}", command=command)
        data = result.model_dump(mode="json")
        data.update(benchmark="audit", command=command, device_name=device_name(args.device),
                    offline_results=str(args.offline_results), broken_on_purpose=(
                        breaks if folder == broken else {}))
        (args.out / f"audit-{name}.json").write_text(json.dumps(data, indent=2))
        header = [f"- command: `{command}`", f"- set rebuilt from {args.offline_results}"]
        if folder == broken:
            header.append("- broken on purpose: " + ", ".join(
                f"{t} ({k})" for t, k in breaks.items()))
        (args.out / f"audit-{name}.md").write_text(
            "\n".join(header) + "\n\n" + to_markdown(result) + "\n")
        print(to_markdown(result), flush=True)
    return 0


if __name__ == "__main__":
    run_script(main)
