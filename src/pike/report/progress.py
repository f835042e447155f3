"""Live progress under `pike optimize` (one line) and `pike bench` (one line per task)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text


class TaskStatus:
    """One task's search as its events tell it: round, budget spent, best, verdict counts."""

    def __init__(self, console: Console, task: str) -> None:
        self.console, self.task = console, task
        self.round = 0
        self.counts: Counter[str] = Counter()
        self.best: float | None = None
        self.budget = ""
        self.rescued = 0
        self.phase = "waiting"

    def update(self, kind: str, **data: Any) -> None:
        ledger = data.get("ledger")
        if ledger is not None:
            self.budget = ledger.describe()
        if kind == "round":
            self.round = data["round"]
        elif kind == "verdict":
            verdict = data["verdict"]
            self.counts[verdict.status] += 1
            if verdict.ok and verdict.speedup and (self.best is None or verdict.speedup > self.best):
                self.best = verdict.speedup
                self.console.log(f"{escape(self.task)}: new best: candidate {data['candidate']}, "
                                 f"{verdict.speedup:.2f}x")
        elif kind == "rescued":
            self.rescued += 1
        elif kind == "ideas":
            self.console.log(f"{escape(self.task)}: brainstormer: {len(data['ideas'])} ideas")
        elif kind == "plan":
            self.console.log(f"{escape(self.task)}: planner: {len(data['steps'])} steps")
        elif kind == "task_phase":
            self.phase = data["phase"]
        elif kind == "task_done":
            self.phase = "failed: " + data["error"][:60] if data.get("error") else "done"

    def render(self) -> Text:
        best = f"{self.best:.2f}x" if self.best else "-"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())) or "none yet"
        return Text(f"{self.task}: round {self.round} | budget {self.budget or '-'} | "
                    f"best {best} | verdicts: {counts} | rescued by fixer: {self.rescued}")


class _LiveDisplay:
    def __init__(self, console: Console) -> None:
        self.console = console
        self._live = Live(self._render(), console=console, refresh_per_second=4,
                          transient=False)

    def __enter__(self) -> _LiveDisplay:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.update(self._render())
        self._live.__exit__(None, None, None)

    def _render(self) -> Text | Group:
        raise NotImplementedError


class SearchProgress(_LiveDisplay):
    """Receives one search's events (from worker threads too) and redraws its status line."""

    def __init__(self, console: Console, task: str) -> None:
        self.status = TaskStatus(console, task)
        super().__init__(console)

    def __call__(self, kind: str, **data: Any) -> None:
        self.status.update(kind, **data)
        self._live.update(self._render())

    def _render(self) -> Text:
        return self.status.render()


class BenchProgress(_LiveDisplay):
    """One status line per task of a campaign, with the task's phase in front."""

    def __init__(self, console: Console, tasks: list[str]) -> None:
        self.tasks = {name: TaskStatus(console, name) for name in tasks}
        self._lock = threading.Lock()  # events come from every task's worker thread
        super().__init__(console)

    def __call__(self, kind: str, **data: Any) -> None:
        task = data.pop("task", None)
        if task is None:
            return
        with self._lock:
            if task not in self.tasks:
                self.tasks[task] = TaskStatus(self.console, task)
            self.tasks[task].update(kind, **data)
            self._live.update(self._render())

    def _render(self) -> Group:
        return Group(*(Text(f"[{s.phase}] ") + s.render() for s in list(self.tasks.values())))
