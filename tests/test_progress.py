"""The live progress line of `pike optimize`."""

from __future__ import annotations

import io

from rich.console import Console

from pike.evaluate.verdict import Verdict
from pike.report.progress import SearchProgress


class FakeLedger:
    def describe(self) -> str:
        return "7/300 queries, $0.42"


def test_progress_shows_round_budget_best_and_counts() -> None:
    out = io.StringIO()
    with SearchProgress(Console(file=out, width=200), "1_GeluMLP") as progress:
        progress("round", round=2, branches=10, ledger=FakeLedger())
        progress("verdict", candidate=3, verdict=Verdict(status="ok", speedup=1.7),
                 ledger=FakeLedger())
        progress("verdict", candidate=4, verdict=Verdict(status="incorrect"),
                 ledger=FakeLedger())
        progress("rescued", branch=1, attempt=1, ledger=FakeLedger())
    text = out.getvalue()
    assert "round 2" in text and "7/300 queries, $0.42" in text
    assert "best 1.70x" in text and "incorrect 1" in text and "ok 1" in text
    assert "rescued by fixer: 1" in text and "new best: candidate 3" in text
