"""Progress under `pike optimize` (one task), `pike bench` and `pike audit` (one line per
task).

On a terminal it is a live display redrawn in place. Anywhere else (a log file, CI, a
pipe) a redrawn line would be cut into whatever is printed next, so there it is plain,
complete lines: one when a round starts, one per notable event, and the final state.
Neither shows source locations: they mean nothing to a user (`--verbose` logs keep them).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from pike.config import RunConfig


@dataclass(frozen=True)
class StatusFields:
    """Which fields of a task's status apply to the run: an offline search spends no LLM
    budget and has no error fixer, an audit has no rounds."""

    step: str | None = "round"  # "round" (PIKE-B, offline), "generation" (PIKE-O)
    budget: bool = False
    fixer: bool = False

    @classmethod
    def for_search(cls, strategy: str, uses_llm: bool) -> StatusFields:
        """The fields of a search: `strategy` as in search.strategy, `uses_llm` whether a
        model is configured (without one the offline strategy runs)."""
        if not uses_llm:
            return cls(step="round")
        return cls(step="generation" if strategy == "evolve" else "round", budget=True,
                   fixer=True)

    @classmethod
    def for_run(cls, cfg: RunConfig) -> StatusFields:
        return cls.for_search(cfg.search.strategy, bool(cfg.llm.model))


AUDIT_FIELDS = StatusFields(step=None)


def _now() -> str:
    return dt.datetime.now().strftime("%H:%M:%S")


class TaskStatus:
    """One task's work as its events tell it: round, budget spent, best, verdict counts.
    `update` returns a message worth a line of its own, if the event has one."""

    def __init__(self, task: str, fields: StatusFields) -> None:
        self.task, self.fields = task, fields
        self.round = 0
        self.counts: Counter[str] = Counter()
        self.best: float | None = None
        self.budget = ""
        self.rescued = 0
        self.phase = "waiting"
        self.outcome = ""  # an audit's verdict on the task's file

    def update(self, kind: str, **data: Any) -> str | None:
        ledger = data.get("ledger")
        if ledger is not None:
            self.budget = ledger.describe()
        if kind == "round":
            self.round = data["round"]
        elif kind == "resumed":  # what earlier calls of a resumed campaign judged
            self.counts.update(data["verdicts"])
            self.best, self.round = data["best"], data["round"]
        elif kind == "verdict":
            return self._verdict(data["verdict"], data["candidate"])
        elif kind == "rescued":
            self.rescued += 1
        elif kind == "ideas":
            return f"brainstormer: {len(data['ideas'])} ideas"
        elif kind == "plan":
            return f"planner: {len(data['steps'])} steps"
        elif kind == "task_phase":
            self.phase = data["phase"]
        elif kind == "skipped":  # the offline search's candidates its baseline ruled out
            return "; ".join(f"not trying {name} (its baseline: {why[:100]})"
                             for name, why in data["skipped"].items())
        elif kind == "known_alone":  # compile modes its baseline found no faster than eager
            return "; ".join(f"{name}: {x:.2f}x alone in its baseline, tried with the best set "
                             "only" for name, x in data["known"].items())
        elif kind == "mode_built":  # a baseline's mode: minutes for a large max-autotune
            return built_line(data["mode"], data.get("build_s"), data.get("error"),
                              data.get("again", False), data.get("prebuild_s"))
        elif kind == "prebuild_failed":
            return prebuild_line(data["mode"], data.get("error"))
        elif kind == "baseline_kept":  # a resumed audit on the card that timed them
            return f"baselines kept from an earlier call on this device ({data['device_id']})"
        elif kind == "task_done":
            self._done(data)
        return None

    def _verdict(self, verdict: Any, candidate: int) -> str | None:
        self.counts[verdict.status] += 1
        # as store.best: a noisy or cut-short figure is never the best
        if verdict.rankable and verdict.speedup and (
                self.best is None or verdict.speedup > self.best):
            self.best = verdict.speedup
            return f"new best: candidate {candidate}, {verdict.speedup:.2f}x"
        return None

    def _done(self, data: dict[str, Any]) -> None:
        if data.get("error"):
            self.phase = "failed: " + data["error"][:60]
            return
        self.phase = "done"
        result = data.get("result")
        confirmed = getattr(result, "best_verdict", None)
        if confirmed is not None and confirmed.ok and confirmed.speedup:
            # the figure its confirming window gave, as a resumed call shows it
            self.best = confirmed.speedup
        audited = data.get("audit")
        if audited is not None:
            speedup = f" {audited.speedup:.2f}x" if audited.ok and audited.speedup else ""
            self.outcome = f"{audited.status}{speedup}"

    def render(self) -> str:
        if self.fields.step is None:  # an audit: one file per task, judged once
            return f"{self.task}: {self.outcome or self.phase}"
        parts = [f"{self.task}: {self.fields.step} {self.round}"]
        if self.fields.budget:
            parts.append(f"budget {self.budget or '-'}")
        parts.append(f"best {self.best:.2f}x" if self.best else "best -")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())) or "none yet"
        parts.append(f"verdicts: {counts}")
        if self.fields.fixer:
            parts.append(f"rescued by fixer: {self.rescued}")
        return " | ".join(parts)


def built_line(mode: str, build_s: float | None, error: str | None,
               again: bool = False, prebuild_s: float | None = None) -> str:
    took = f" in {build_s:.1f} s" if build_s is not None else ""
    if build_s is not None and prebuild_s is not None and error is None:
        took += f" ({build_s - prebuild_s:.1f} s of it with the device alone)"
    took += " (again, in a new child)" if again else ""
    if error is None:
        return f"baseline {mode} built{took}"
    reason = error.strip()[:120] or "no reason given"
    if reason.startswith("incorrect: "):  # it built, and answers otherwise than eager
        return f"baseline {mode} built{took}, but is incorrect: {reason[11:]}"
    return f"baseline {mode} failed{took}: {reason}"


def prebuild_line(mode: str, error: str | None) -> str:
    reason = (error or "").strip()[:120] or "no reason given"
    return (f"baseline {mode}: its pre-build took the reference's child down ({reason}); "
            "built again alone, without one")


class _Progress:
    """Receives events (from worker threads too) for the tasks of a run and shows them:
    live on a terminal, as plain lines elsewhere."""

    def __init__(self, console: Console, tasks: list[str], fields: StatusFields,
                 show_phase: bool) -> None:
        self.console, self.fields, self.show_phase = console, fields, show_phase
        self.tasks = {name: TaskStatus(name, fields) for name in tasks}
        self._lock = threading.Lock()  # events come from every task's worker thread
        self._live: Live | None = None
        self._printed: dict[str, str] = {}  # the last status line printed per task
        if console.is_terminal:
            self._live = Live(self._render(), console=console, refresh_per_second=4,
                              transient=False)

    def __enter__(self) -> _Progress:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._close(exc[0] is None)
        except (OSError, SystemExit):  # a closed pipe: rich turns it into SystemExit(1)
            if exc[0] is None:
                raise
            # Unwinding a Ctrl-C or an error: that is what the caller acts on (an
            # interrupted run exits within seconds), not a last status line lost.

    def _close(self, clean: bool) -> None:
        with self._lock:
            if self._live is not None:
                self._live.update(self._render())
                self._live.__exit__(None, None, None)
            elif clean:  # on an error, its one line is what the user needs
                for status in self.tasks.values():
                    self._status(status)

    def __call__(self, kind: str, **data: Any) -> None:
        name = data.pop("task", None) or self._only_task()
        if name is None:
            return
        with self._lock:
            status = self.tasks.setdefault(name, TaskStatus(name, self.fields))
            message = status.update(kind, **data)
            if message is not None:
                self._line(f"{_now()} {escape(name)}: {escape(message)}")
            if self._live is not None:
                self._live.update(self._render())
            elif kind in ("round", "task_phase", "task_done"):
                self._status(status)

    def _status(self, status: TaskStatus) -> None:
        """A task's status as a plain line, unless that line was the last one printed
        for it (the final states would repeat what the last events said)."""
        line = self._status_line(status)
        if self._printed.get(status.task) != line:
            self._printed[status.task] = line
            self._line(f"{_now()} {line}")

    def _only_task(self) -> str | None:
        return next(iter(self.tasks)) if len(self.tasks) == 1 else None

    def _status_line(self, status: TaskStatus) -> str:
        phase = f"\\[{escape(status.phase)}] " if self.show_phase else ""
        return phase + escape(status.render())

    def _line(self, text: str) -> None:
        # soft_wrap: a long line stays one line in a log, instead of being cut at 80 columns
        self.console.print(text, highlight=False, soft_wrap=True)

    def _render(self) -> Group:
        return Group(*(Text.from_markup(self._status_line(s)) for s in list(self.tasks.values())))


class SearchProgress(_Progress):
    """One search's status line."""

    def __init__(self, console: Console, task: str,
                 fields: StatusFields | None = None) -> None:
        super().__init__(console, [task], fields or StatusFields(), show_phase=False)


class BenchProgress(_Progress):
    """One status line per task of a campaign or an audit, with the task's phase in front."""

    def __init__(self, console: Console, tasks: list[str],
                 fields: StatusFields | None = None) -> None:
        super().__init__(console, tasks, fields or StatusFields(), show_phase=True)
