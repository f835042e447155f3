"""What a timer's exclusive hold costs to take and to let go, with the others stopped in
the parent (pike before process_stopper.py) and by the helper process (now), while other
threads of the parent compute, as a bench's evaluation threads do.

    python bench/stopping_others.py [--children 20] [--grandchildren 16] [--busy 0,1,3]
                                    [--pollers]

Starts CHILDREN listed processes of GRANDCHILDREN each (a runner with its compile
workers), then takes `device_lock.hold(exclusive=True)` 20 times for each count of busy
Python threads, both ways. With --pollers the busy threads are the parent's own: one
thread a child reads its tree's memory every 0.05 s (ChildProcess.measure_memory, as a
waiting evaluation's poll does), the tree found again every poll (pike before 2026-12-04,
late) or once a second (now). No GPU: the hold's stopping is host work (it takes the device's
lock files and signals processes; nothing touches a GPU). Results go to
bench/results/stopping-others-<tag>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import torch
from common import RESULTS, now, run_script, this_command, with_ext

from pike.evaluate import device_lock, process_stopper, sandbox
from pike.evaluate.sandbox import ChildProcess


def _start(children: int, grandchildren: int) -> list[subprocess.Popen]:
    script = (f"import subprocess, time\n"
              f"kids = [subprocess.Popen(['sleep', '600']) for _ in range({grandchildren})]\n"
              "print('up', flush=True)\ntime.sleep(600)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
             for _ in range(children)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == b"up\n"
    return procs


def _busy(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))  # pure Python: holds the GIL between switch intervals


def _poll(child: ChildProcess, stop: threading.Event) -> None:
    while not stop.wait(0.05):
        child.measure_memory()


def _pollers(procs: list[subprocess.Popen], stop: threading.Event) -> list[threading.Thread]:
    threads = []
    for proc in procs:
        child = ChildProcess.__new__(ChildProcess)  # only what measure_memory reads
        child.proc = proc
        threads.append(threading.Thread(target=_poll, args=(child, stop), daemon=True))
    return threads


def _measure(holds: int, busy: int, procs: list[subprocess.Popen] | None = None) -> dict:
    stop = threading.Event()
    spinners = ([threading.Thread(target=_busy, args=(stop,), daemon=True)
                 for _ in range(busy)] if procs is None else _pollers(procs, stop))
    for t in spinners:
        t.start()
    enter, leave = [], []
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        for _ in range(holds):
            t0 = time.perf_counter()
            with device_lock.hold("cuda:0", exclusive=True):
                t1 = time.perf_counter()
            enter.append(t1 - t0)
            leave.append(time.perf_counter() - t1)
    finally:
        stop.set()
        for t in spinners:
            t.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"busy": busy, "parent_cores": cpu / wall, "enter_median_s": statistics.median(enter),
            "enter_max_s": max(enter), "leave_median_s": statistics.median(leave)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--children", type=int, default=20)
    p.add_argument("--grandchildren", type=int, default=16)
    p.add_argument("--busy", default="0,1,3", help="busy parent threads, one run each")
    p.add_argument("--holds", type=int, default=20)
    p.add_argument("--tag", default="cpu")
    p.add_argument("--pollers", action="store_true",
                   help="the busy threads: one memory poller a child (see above)")
    args = p.parse_args()
    locks = tempfile.mkdtemp(prefix="pike-stopping-")
    os.environ["PIKE_LOCK_DIR"] = locks
    procs = _start(args.children, args.grandchildren)
    rows = []
    try:
        for pid in (p.pid for p in procs):
            device_lock.list_child("cuda:0", pid, "pause_others")
        for way in ("helper", "parent"):
            # three failures in a row and the parent does the work itself
            process_stopper._helper._failures = 0 if way == "helper" else 3
            if args.pollers:
                for every in (0.0, 1.0):  # the tree found every poll, or once a second
                    sandbox._TREE_EVERY_S = every
                    row = {"way": way, **_measure(args.holds, len(procs), procs),
                           "busy": f"{len(procs)} pollers, tree found "
                           + ("every poll" if every == 0 else f"every {every:g} s")}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                continue
            for busy in (int(b) for b in args.busy.split(",")):
                row = {"way": way, **_measure(args.holds, busy)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        for proc in procs:
            for c in psutil.Process(proc.pid).children(recursive=True):
                c.kill()
            proc.kill()
        shutil.rmtree(locks, ignore_errors=True)
    data = {"command": this_command(), "date": now(), "torch": torch.__version__,
            "host": f"{os.cpu_count()} cores", "processes": len(psutil.pids()),
            "children": args.children, "grandchildren": args.grandchildren, "rows": rows}
    stem = RESULTS / f"stopping-others-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [f"# A timer's hold: taking it (stopping the others) and letting go ({args.tag})",
             "", f"- command: `{data['command']}`", f"- date: {data['date']}, torch "
             f"{data['torch']}, {data['host']}, {data['processes']} processes on the host "
             f"while measuring", f"- {args.children} listed children of "
             f"{args.grandchildren} children each; {args.holds} holds a row", "",
             "| stopped by | busy threads in the parent | the parent's CPU, cores | taking, "
             "median s | taking, max s | letting go, median s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['way']} | {r['busy']} | {r['parent_cores']:.2f} | "
              f"{r['enter_median_s']:.3f} | {r['enter_max_s']:.3f} | "
              f"{r['leave_median_s']:.3f} |" for r in rows]
    with_ext(stem, ".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {with_ext(stem, '.md')}")
    return 0


if __name__ == "__main__":
    run_script(main)
