"""A ledger of the device held alone: what held it, when it asked, took and let it go.

While a timer holds a GPU alone, every other evaluation on it stands stopped
(device_lock.py). A search's budget leaves that stopped time out, so the wall time of a
`pike bench` beyond its searches' budgets is mostly these holds. From the verdicts alone
it could only be estimated (each verdict keeps its own stopped seconds, not whose window
stopped it); the ledger says it outright, per purpose: a candidate's window, a task's
baselines (autotuning builds and the window of its modes), a confirming window, the
timing loop's calibration. It also keeps how long each hold waited to be taken, for the
shared holders (comparisons, final checks) to leave.

`pike bench` records into its run dir (`device-holds.jsonl`, one JSON line a hold,
appended by every call of a resumed run); nothing is recorded where no one asked. A
failure to write is logged and never reaches an evaluation.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

LEDGER_NAME = "device-holds.jsonl"

# What an exclusive hold is for (device_lock.hold's `purpose`).
CANDIDATE_WINDOW = "candidate window"
CANDIDATE_AGAIN = "candidate window, again"  # a second look or a steady-window retry
CONFIRMING_WINDOW = "confirming window"
BASELINE = "baseline builds and window"
CALIBRATION = "timing-loop calibration"
OTHER = "other"

# One ledger a process at a time, for all its threads (a bench's evaluations run in its
# pool's threads); holds taken in other processes (Ray actors) are not recorded.
_lock = threading.Lock()
_path: Path | None = None
_failed: set[Path] = set()


@contextmanager
def recording(path: Path) -> Iterator[None]:
    """Record every exclusive hold of this process into `path` for the `with` block."""
    global _path
    with _lock:
        before, _path = _path, path
    try:
        yield
    finally:
        with _lock:
            _path = before


def note(purpose: str, device: str, asked: float, held: float, released: float,
         stopped: int, stopping_s: float | None = None) -> None:
    """One hold: wall-clock times (time.time()) it was asked for, taken and let go, how
    many processes it stopped and how long stopping them took (`stopping_s`: of a
    candidate window's hold on an H200 level2 bench, 0.58 s median was outside its
    timing, and where it went was not recorded)."""
    entry = {"purpose": purpose, "device": device, "pid": os.getpid(),
             "asked": round(asked, 4), "held": round(held, 4),
             "released": round(released, 4), "stopped": stopped}
    if stopping_s is not None:
        entry["stopping_s"] = round(stopping_s, 4)
    line = json.dumps(entry) + "\n"
    with _lock:
        if _path is None:
            return
        try:
            with open(_path, "a", encoding="utf-8") as ledger:
                ledger.write(line)
        except OSError as err:  # said once a ledger: it never fails an evaluation
            if _path not in _failed:
                _failed.add(_path)
                log.warning("device holds not recorded in %s: %s", _path, err)


def read(path: Path) -> list[dict]:
    """The holds in a ledger; a line cut off by a kill mid-write is left out."""
    holds = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            hold = json.loads(line)
        except ValueError:
            continue
        if isinstance(hold, dict) and {"purpose", "asked", "held", "released"} <= hold.keys():
            holds.append(hold)
    return holds


def summarize(holds: list[dict], start: float | None = None,
              end: float | None = None) -> dict[str, dict[str, float]]:
    """Per purpose: holds, seconds held (total and median), seconds waited to take them,
    and the medians of processes each stopped and of the seconds stopping them took
    (where the ledger says); only holds taken in [start, end) where
    given. Holds of one device never overlap, so their totals add up to that device's
    time; with several devices they add up over all of them."""
    by: dict[str, list[dict]] = {}
    for h in holds:
        if (start is None or h["held"] >= start) and (end is None or h["held"] < end):
            by.setdefault(h["purpose"], []).append(h)
    found = {}
    for purpose, hs in sorted(by.items(), key=lambda kv: -_held(kv[1])):
        found[purpose] = {
            "holds": len(hs),
            "held_s": _held(hs),
            "median_s": statistics.median(h["released"] - h["held"] for h in hs),
            "waited_s": sum(max(0.0, h["held"] - h["asked"]) for h in hs),
            "stopped": statistics.median(h.get("stopped", 0) for h in hs)}
        stopping = [h["stopping_s"] for h in hs if isinstance(h.get("stopping_s"), float)]
        if stopping:  # ledgers from 2026-12-04 (late) on
            found[purpose]["stopping_s"] = statistics.median(stopping)
    return found


def _held(holds: list[dict]) -> float:
    return sum(max(0.0, h["released"] - h["held"]) for h in holds)


def said_briefly(run_dir: Path) -> str | None:
    """One line on what held the device alone over a run's calls (None without a
    ledger): the part of a bench's wall time its searches' budgets do not count."""
    found = summarize(read(run_dir / LEDGER_NAME))
    if not found:
        return None
    total = sum(p["held_s"] for p in found.values())
    parts = ", ".join(f"{name} {p['held_s']:.0f} s" for name, p in found.items())
    return (f"device held alone: {total:.0f} s over the run's calls ({parts}); every other "
            "evaluation on the GPU stood stopped meanwhile")
