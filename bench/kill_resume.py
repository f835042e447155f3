"""Kill `pike audit` the way a user or a device session's end does, again and again, and
resume it: the verdicts must be those of an audit never interrupted, and nothing may
outlive a kill for longer than the next pike's start (no runner process; temp folders
only until the next pike sweeps them).

    python bench/kill_resume.py SET TASKS [--kills 12] [--signal KILL|INT|TERM]
        [--device cpu] [--seed 1] [--tag TAG]

SET is a solution set (`pike export RUN --set SET`, or a benchmark's kept set), TASKS its
task folder. Each call is stopped after a random 3 to 17 s (seeded); the last runs to its
end. Writes bench/results/kill-resume-<tag>.json and .md with device, torch version, date
and command.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from common import device_name, now, run_script, this_command, with_ext

ROOT = Path(__file__).resolve().parent.parent


def _runners() -> list[int]:
    """Evaluation children on this host (only one audit runs while this script does)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if "pike.evaluate.runner" in " ".join(p.info["cmdline"] or []):
            found.append(p.pid)
    return found


def _verdicts(run_dir: Path) -> dict[str, list]:
    tasks = json.loads((run_dir / "audit.json").read_text())["tasks"]
    return {t["task"]: [t["status"], t.get("trials_passed")] for t in tasks}


def _call(args: list[str], tmp: Path, log: Path, stop_after: float | None,
          how: signal.Signals) -> tuple[int | None, float]:
    """One `pike audit` call; stopped by `how` after `stop_after` seconds (None: to its end).
    Returns its exit status (None where it had to be killed after the signal) and its
    seconds."""
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pike", *args], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp)})
        try:
            return proc.wait(timeout=stop_after), time.monotonic() - started
        except subprocess.TimeoutExpired:
            proc.send_signal(how)
        try:
            proc.wait(timeout=60)
            return proc.returncode, time.monotonic() - started
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("solutions", type=Path)
    parser.add_argument("tasks", type=Path)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--signal", default="KILL", choices=["KILL", "INT", "TERM"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tag", default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    how = signal.Signals[f"SIG{args.signal}"]
    draw = random.Random(args.seed)
    common = ["--device", args.device]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kill-resume-") as scratch:
        scratch_dir = Path(scratch)
        tmp = scratch_dir / "tmp"
        tmp.mkdir()
        clean, cut = scratch_dir / "clean", scratch_dir / "cut"
        status, took = _call(["audit", str(args.solutions), str(args.tasks), *common,
                              "--out", str(clean)], tmp, scratch_dir / "clean.log", None, how)
        if status != 0:
            print((scratch_dir / "clean.log").read_text(), file=sys.stderr)
            return 1
        expected = _verdicts(clean)
        print(f"uninterrupted: {took:.0f} s, {expected}", flush=True)
        first = ["audit", str(args.solutions), str(args.tasks), *common, "--out", str(cut)]
        resume = ["audit", "--resume", str(cut)]
        for call in range(args.kills + 1):
            last = call == args.kills
            after = None if last else draw.uniform(3, 17)
            status, took = _call(first if call == 0 else resume, tmp,
                                 scratch_dir / f"call-{call}.log", after, how)
            time.sleep(1)
            rows.append({"call": call, "stopped_after_s": round(after, 1) if after else None,
                         "exit": status, "seconds": round(took, 1),
                         "runners_left": len(_runners())})
            print(json.dumps(rows[-1]), flush=True)
            if status == 0 and not last:
                break  # finished before its stop: the rest has nothing to cut
        if rows[-1]["exit"] != 0:  # the last call may be needed to reach the end
            status, took = _call(resume, tmp, scratch_dir / "final.log", None, how)
            rows.append({"call": len(rows), "stopped_after_s": None, "exit": status,
                         "seconds": round(took, 1), "runners_left": len(_runners())})
        got = _verdicts(cut) if (cut / "audit.json").exists() else {}
        left_dirs = sorted(p.name for p in tmp.iterdir() if p.name.startswith("pike-"))
    same = got == expected
    result = {"benchmark": "kill-resume", "device": args.device,
              "device_name": device_name(args.device), "torch_version": torch.__version__,
              "date": now(), "command": this_command(), "signal": args.signal,
              "expected": expected, "got": got, "same_verdicts": same, "calls": rows,
              "temp_dirs_left_after_the_last_call": left_dirs}
    write(args, result)
    ok = same and not left_dirs and all(r["runners_left"] == 0 for r in rows)
    return 0 if ok else 1


def write(args: argparse.Namespace, result: dict) -> None:
    rows = result["calls"]
    stopped = sum(1 for r in rows if r["stopped_after_s"] is not None)
    lines = [f"# An audit stopped {stopped} times by SIG{result['signal']} and resumed "
             f"({result['device_name']})", "",
             f"- device: {result['device']}, torch {result['torch_version']}, "
             f"date {result['date']}",
             f"- command: `{result['command']}`", "",
             f"Verdicts the same as an audit never interrupted: "
             f"**{'yes' if result['same_verdicts'] else 'no'}** "
             f"({result['got']}); runner processes left after any call: "
             f"{max(r['runners_left'] for r in rows)}; temp folders left after the last "
             f"call: {len(result['temp_dirs_left_after_the_last_call'])}.", "",
             "| call | stopped after (s) | exit | seconds | runners left |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['call']} | {r['stopped_after_s'] or 'ran to its end'} | {r['exit']} | "
              f"{r['seconds']} | {r['runners_left']} |" for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"kill-resume-{args.tag or args.device.split(':')[0]}"
    with_ext(stem, ".json").write_text(json.dumps(result, indent=2) + "\n")
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    run_script(main)
