"""`pike bench`'s closing table says how many candidates each task's budget bought."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from pike.report.tables import bench_table
from pike.search.campaign import CampaignResult, TaskOutcome
from pike.search.session import OptimizeResult


def _rows(result: CampaignResult) -> list[list[str]]:
    console = Console(width=200, record=True)
    console.print(bench_table(result))
    return [[cell.strip() for cell in re.split("[│┃]", line)[1:-1]]
            for line in console.export_text().splitlines() if re.search("[│┃]", line)]


def test_each_task_shows_the_candidates_it_judged(tmp_path: Path) -> None:
    judged = OptimizeResult(run_dir=tmp_path, task="1_GeluMLP", best_source=None,
                            best_verdict=None, queries=0, dollars=0.0,
                            verdicts={"ok": 9, "incorrect": 2, "compile_error": 1})
    result = CampaignResult(run_dir=tmp_path, outcomes=[
        TaskOutcome(task="1_GeluMLP", result=judged),
        TaskOutcome(task="2_ConvBlock", error="reference failed")])
    header, gelu, conv = _rows(result)
    assert header[:3] == ["task", "best", "judged"]
    assert gelu[0] == "1_GeluMLP" and gelu[2] == "12"
    assert conv[0] == "2_ConvBlock" and conv[1].startswith("failed") and conv[2] == ""
