"""The live line under `pike optimize`: round, budget spent, best speedup, verdict counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text


class SearchProgress:
    """Receives the search's events (from worker threads too) and redraws one status line."""

    def __init__(self, console: Console, task: str) -> None:
        self.console, self.task = console, task
        self.round = 0
        self.counts: Counter[str] = Counter()
        self.best: float | None = None
        self.budget = ""
        self.rescued = 0
        self._live = Live(self._render(), console=console, refresh_per_second=4,
                          transient=False)

    def __enter__(self) -> SearchProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.update(self._render())
        self._live.__exit__(None, None, None)

    def __call__(self, kind: str, **data: Any) -> None:
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
                self.console.log(f"new best: candidate {data['candidate']}, "
                                 f"{verdict.speedup:.2f}x")
        elif kind == "rescued":
            self.rescued += 1
        elif kind == "ideas":
            self.console.log(f"brainstormer: {len(data['ideas'])} ideas")
        self._live.update(self._render())

    def _render(self) -> Text:
        best = f"{self.best:.2f}x" if self.best else "-"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())) or "none yet"
        return Text(f"{self.task}: round {self.round} | budget {self.budget or '-'} | "
                    f"best {best} | verdicts: {counts} | rescued by fixer: {self.rescued}")
