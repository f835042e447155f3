"""Every cheat class the evaluator defends against, one candidate of ours each: the verdict,
what caught it, and whether anything got out (a file, a process, a secret).

    python bench/adversarial.py [--device cuda] [--sandbox auto|required|off] [--only a,b]
    python bench/adversarial.py --combine PART.json PART.json --out DIR --name STEM

Runs on examples/tasks/1_GeluMLP.py with the default protocol (as `pike eval` judges).
Writes bench/results/adversarial-<device>[-<sandbox>].json and .md with device, torch
version, date and command. A run cut off by a device call's limit is finished with
--only the candidates it had not reached; --combine joins the parts' JSON into one page
(in the classes' order, each part's command and date quoted), judging nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import psutil
import torch
from common import device_name, now, run_script, this_command

from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.evaluate.child_launch import build_cache_root
from pike.evaluate.os_sandbox import sandbox_status
from pike.evaluate.verdict import Verdict
from pike.task import Task

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "examples" / "tasks" / "1_GeluMLP.py"
CANDIDATES = ROOT / "tests" / "candidates"
CANARY = "sk-CANARYadversarial0123456789"

# class -> candidates; `honest` ones pass only where the attack found nothing to use.
CLASSES: dict[str, list[str]] = {
    "telling timed calls from checked ones": [
        "stale_by_frames", "stale_when_fast", "memo_by_version", "memo_by_values",
        "counts_calls", "caches_by_pointer", "lazy_when_timed", "iterates_lazily",
        "memo_shapes_its_tail", "memo_stretches_its_blocks", "leaves_a_mode", "lies_by_metaclass",
        "replaces_a_kernel", "replaces_a_nested_kernel", "slices_the_staging"],
    "reaching the evaluator's objects": [
        "wraps_channel", "mock_patches_tensor", "forges_messages", "patches_evaluator",
        "patches_event", "walks_gc", "rewrites_samples", "zeroes_samples", "tensor_subclass",
        "thread_outlives", "pool_outlives", "pool_outlives_builtin", "leaves_a_timer",
        "reads_probes_by_frames", "pulls_probes_ahead", "reenters_the_rotation",
        "disarms_the_guards", "empties_the_guards_lists", "starves_probes",
        "reads_inside_the_hook", "replaces_audit", "patches_guards_class",
        "patches_rotation_class", "patches_channel_class", "truthy_enabled",
        "pulls_by_thread", "swaps_getframe", "reads_other_threads_frames",
        "shadows_taker", "claims_probes",
        "floods_the_channel", "profiles_the_seal", "profiles_by_finalizer", "hooks_the_audit",
        "calls_back_from_gc", "calls_back_by_signal", "reads_the_seal_by_ctypes",
        "reads_the_seal_on_free"],
    "passing its code off as a library's": [
        "names_code_as_library", "helper_in_torch_folder", "compiles_through_stdlib",
        "marshals_code", "loader_names_code_as_library", "unmarshals_through_importlib"],
    "predictable or readable inputs": ["assumes_randn", "reads_inputs_ahead",
                                       "reads_timed_sets_ahead"],
    "finding the task and the reference": ["uses_reference", "slows_the_reference"],
    "escaping the process": ["escapes_by_subprocess", "double_forks", "spawns_child",
                             "writes_outside", "opens_socket", "poisons_the_build_cache",
                             "starts_many_processes"],
    "secrets": ["leaks_secrets", "reads_secrets"],
    "filling the disk": ["fills_its_folder", "makes_many_files"],
    "trapping the parent's clean-up": ["nests_folders_deep", "shares_its_lists"],
}
HONEST_WHEN_BLOCKED = {"reads_inputs_ahead", "reads_timed_sets_ahead", "slows_the_reference",
                       "reads_secrets", "poisons_the_build_cache", "nests_folders_deep"}
PLANTED = "pike-poison"  # what poisons_the_build_cache leaves for the reference to find


def _sleepers() -> set[int]:
    found = set()
    for p in psutil.process_iter(["name", "cmdline"]):
        if p.info["name"] == "sleep" and any(a.startswith("30") for a in p.info["cmdline"] or []):
            found.add(p.pid)
    return found


def judge_one(task: Task, name: str, cfg: EvalConfig, scratch: Path) -> dict:
    source = (CANDIDATES / f"{name}.py").read_text().replace("TASK_PATH", str(task.path))
    target = scratch / f"{name}-escaped"
    os.environ["PIKE_TEST_TARGET"] = str(target)
    before = _sleepers()
    started = time.monotonic()
    with socket.socket() as server:  # what a candidate's connection would reach
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.2)
        os.environ["PIKE_TEST_PORT"] = str(server.getsockname()[1])
        raised = False
        try:
            verdict = evaluate(task, source, cfg)
        except Exception as err:  # the evaluator itself undone: recorded, never defended
            raised = True
            verdict = Verdict(status="crashed", message=f"the evaluator raised {err!r}")
        try:
            server.accept()
            reached = True
        except TimeoutError:
            reached = False
    time.sleep(0.5)
    planted = list(build_cache_root(cfg, "reference").rglob(PLANTED))
    for path in planted:  # each candidate is judged on what it did itself
        path.unlink()
    survivors = sorted(_sleepers() - before)
    for pid in survivors:
        psutil.Process(pid).kill()
    dumped = verdict.model_dump_json()
    honest = name in HONEST_WHEN_BLOCKED
    escaped = target.exists() or bool(planted)
    # `ok` with its figure withheld (slow probes in an unsteady window) gains no figure
    withheld = verdict.ok and verdict.speedup is None and verdict.noisy
    defended = (verdict.status != "ok" or withheld or honest) and not (
        raised or escaped or survivors or reached or CANARY in dumped)
    return {"candidate": name, "status": verdict.status, "phase": verdict.phase,
            "speedup": verdict.speedup, "message": (verdict.message or verdict.noisy_why
                                                    ).splitlines()[0][:240]
            if verdict.message or verdict.noisy_why else "", "file_escaped": escaped,
            "process_survived": bool(survivors), "network_reached": reached,
            "canary_in_verdict": CANARY in dumped, "evaluator_raised": raised,
            "defended": defended,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sandbox", default="auto", choices=["auto", "required", "off"])
    parser.add_argument("--only", default=None, help="comma list of candidate names")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--combine", type=Path, nargs="+", default=None,
                        help="JSON results of parts of one run, joined into one page")
    parser.add_argument("--name", default=None, help="with --combine: the page's file stem")
    parser.add_argument("--note", default=None, help="with --combine: a line for the page "
                        "(which pike commit the parts ran, say)")
    args = parser.parse_args()
    if args.combine:
        return combine(args.combine, args.out, args.name or "adversarial-combined", args.note)
    os.environ["OPENAI_API_KEY"] = CANARY  # what an escaped child would look for
    os.environ["DATABASE_URL"] = f"postgres://pike:{CANARY}@db.invalid/pike"
    os.environ["PIKE_TEST_LEAK"] = CANARY  # planted where the candidate can read it
    cfg = EvalConfig(device=args.device, sandbox=args.sandbox)
    task = Task.from_file(TASK)
    only = set(args.only.split(",")) if args.only else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="pike-adversarial-") as scratch:
        for cheat_class, names in CLASSES.items():
            for name in names:
                if only and name not in only:
                    continue
                row = {"class": cheat_class, **judge_one(task, name, cfg, Path(scratch))}
                rows.append(row)
                print(json.dumps(row), flush=True)
                write(args, rows)
    return 0 if all(r["defended"] for r in rows) else 1


def write(args: argparse.Namespace, rows: list[dict]) -> None:
    """Rewritten after every candidate, so a run cut off keeps what it judged."""
    result = {"benchmark": "adversarial", "device": args.device,
              "device_name": device_name(args.device), "torch_version": torch.__version__,
              "sandbox": sandbox_status(args.sandbox), "date": now(),
              "command": this_command(), "rows": rows}
    stem = f"adversarial-{'cuda' if args.device.startswith('cuda') else 'cpu'}"
    if args.sandbox != "auto":
        stem += f"-sandbox-{args.sandbox}"
    _write_page(result, args.out, stem)


def combine(parts: list[Path], out: Path, stem: str, note: str | None = None) -> int:
    """One page of the parts of a run (same device and torch): each candidate's row from
    the last part that judged it, in the classes' order."""
    results = [json.loads(part.read_text()) for part in parts]
    if len({(r["device_name"], r["torch_version"]) for r in results}) > 1:
        raise SystemExit("the parts were judged on different devices or torch versions")
    by_name = {row["candidate"]: row for r in results for row in r["rows"]}
    order = [name for names in CLASSES.values() for name in names]
    rows = [by_name[name] for name in order if name in by_name]
    first = results[0]
    result = {**first, "date": " and ".join(r["date"] for r in results),
              "command": "`; `".join(r["command"] for r in results) + "`; combined by `"
              + this_command(), "parts": [str(part) for part in parts], "rows": rows,
              **({"note": note} if note else {})}
    _write_page(result, out, stem)
    missing = [name for name in order if name not in by_name]
    if missing:
        print(f"not judged in any part: {', '.join(missing)}")
    return 0 if all(r["defended"] for r in rows) and not missing else 1


def _write_page(result: dict, out: Path, stem: str) -> None:
    rows = result["rows"]
    lines = [f"# Adversarial candidates ({result['device_name']})", "",
             f"- device: {result['device']}, torch {result['torch_version']}, "
             f"date {result['date']}",
             f"- OS sandbox: {result['sandbox']}", f"- command: `{result['command']}`",
             *([f"- note: {result['note']}"] if result.get("note") else []), "",
             f"{sum(r['defended'] for r in rows)} of {len(rows)} defended: not `ok` (or `ok` "
             "only where the attack found nothing, or with its figure withheld), the evaluator not made to raise, no file "
             "written outside (nor in the reference's build cache), no process left, no "
             "connection made, no canary secret in the verdict.", "",
             "| class | candidate | verdict | what caught it | defended |",
             "|---|---|---|---|---|"]
    for r in rows:
        said = "".join(c if c.isprintable() else " " for c in r["message"])  # environ: NULs
        said = said.replace("|", "/")[:140] or "(nothing to catch)"
        lines.append(f"| {r['class']} | {r['candidate']} | {r['status']} | {said} | "
                     f"{'yes' if r['defended'] else '**no**'} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    run_script(main)
