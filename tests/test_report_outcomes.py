"""What became of each task, as `pike report` tells it: a task a cut-off campaign never
reached is "not run", apart from one judged without a correct candidate, though both count
1.0x; and a search's confirmed best is the figure shown, with the search's own beside it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pike.cli import app
from pike.report import build_report
from pike.report.data import final_geomean, load_run, outcome_counts
from pike.report.figures import per_task_figure
from pike.report.terminal import not_run_lines
from pike.store import DONE_STATE, ERROR_STATE, MISSING_STATE, RunStore
from tests.test_report import REFERENCE, add, attributes_in_browser, solution

TASKS = ("1_Done", "2_AllWrong", "3_CutMidway", "4_NeverStarted", "5_BadReference")


def cut_off_bench(run_dir: Path) -> Path:
    """A `pike bench` run stopped by its time limit, as its store is left: every task added
    up front; the first two finished (one solved, one with only wrong candidates); the
    third cut off while its first candidate was being judged; the fourth never started;
    the fifth given up because its reference failed."""
    config = {"llm": {"model": None}, "search": {"strategy": "branching"}}
    with RunStore.create(run_dir, config, "pike bench tasks/") as store:
        for task in TASKS:
            store.add_task(task, f"{task}.py", task[0] * 64, REFERENCE)
        add(store, "1_Done", solution("fast"), "ok", 2.0, role="offline", round_=1)
        add(store, "2_AllWrong", solution("wrong"), "incorrect", role="offline", round_=1)
        store.add_candidate("3_CutMidway", solution("unjudged"), parent_id=None,
                            role="offline", round=1, branch=0)
        for task in ("1_Done", "2_AllWrong", "5_BadReference"):
            store.set_state(task, DONE_STATE, True)
        store.set_state("5_BadReference", ERROR_STATE, "the reference raised ValueError")
    return run_dir


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cut_off_bench(tmp_path_factory.mktemp("runs") / "bench-cut")


@pytest.fixture(scope="module")
def page(bench_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_report([bench_dir], tmp_path_factory.mktemp("report") / "out")


def test_tasks_never_judged_are_not_run_and_counted_apart(bench_dir: Path) -> None:
    run = load_run(bench_dir)
    outcomes = {t.name: t.outcome() for t in run.tasks}
    assert outcomes == {"1_Done": "solved", "2_AllWrong": "no_correct",
                        "3_CutMidway": "not_run", "4_NeverStarted": "not_run",
                        "5_BadReference": "not_run"}
    assert outcome_counts(run) == {"solved": 1, "no_correct": 1, "not_run": 3}
    # both kinds count 1.0x in the geomean: the user keeps the reference either way
    assert final_geomean(run) == pytest.approx(2.0 ** (1 / 5))
    reasons = {t.name: t.not_run_reason() for t in run.tasks if t.outcome() == "not_run"}
    assert reasons == {"3_CutMidway": "cut off before its first verdict",
                       "4_NeverStarted": "cut off or stopped before it started",
                       "5_BadReference": "its reference failed: the reference raised ValueError"}


def test_an_audited_task_without_a_file_is_not_run(tmp_path: Path) -> None:
    with RunStore.create(tmp_path / "audit", {}, "pike audit set/ tasks/") as store:
        store.add_task("1_Add", "1_Add.py", "1" * 64, REFERENCE)
        store.set_state("1_Add", MISSING_STATE, True)
        store.set_state("1_Add", DONE_STATE, True)
    task = load_run(tmp_path / "audit").tasks[0]
    assert (task.outcome(), task.not_run_reason()) == ("not_run", "no solution file in the set")


def test_the_page_lists_and_counts_not_run_apart(page: Path) -> None:
    html = page.read_text()
    rows = {name: re.search(rf'<tr class="([\w -]+)">\s*<td class="name"[^>]*><b>{name}</b>',
                            html) for name in TASKS}
    assert {name: m.group(1).split()[0] for name, m in rows.items() if m} == {
        "1_Done": "solved", "2_AllWrong": "no-correct", "3_CutMidway": "not-run",
        "4_NeverStarted": "not-run", "5_BadReference": "not-run"}
    assert "not run</span> cut off or stopped before it started; counts 1.0×" in html
    # the runs table: 5 tasks, 1 solved, 1 with no correct candidate, 3 not run
    cells = re.findall(r'<td class="num">(\d+)</td>', html.split("<h2>Runs</h2>")[1])[:4]
    assert cells == ["5", "1", "1", "3"]
    assert "3 tasks not run (3_CutMidway, 4_NeverStarted, 5_BadReference)" in html


def test_the_per_task_figure_draws_not_run_apart(bench_dir: Path) -> None:
    figure = per_task_figure([load_run(bench_dir)])
    ax = figure.axes[0]
    assert sorted(t.get_text() for t in ax.texts if t.get_text() == "not run") == ["not run"] * 3
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "no correct candidate (1.0× fallback)" in labels
    assert any(label.startswith("not run") for label in labels)


def test_a_browser_shows_the_cut_off_tasks_as_not_run(page: Path, tmp_path: Path) -> None:
    dom = attributes_in_browser(page, tmp_path, [
        "data-images-loaded", "data-rows-not-run", "data-rows-no-correct", "data-rows-solved"])
    assert dom == {"data-images-loaded": "5/5", "data-rows-not-run": "3",
                   "data-rows-no-correct": "1", "data-rows-solved": "1"}


def test_pike_report_names_the_tasks_not_run_in_the_terminal(bench_dir: Path,
                                                            tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(bench_dir), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    counts = r"offline · bench-cut\s*│\s*5\s*│\s*1\s*│\s*1\s*│\s*3\s*│"  # tasks, solved, ...
    assert re.search(counts, result.stdout), result.stdout
    assert ("not run in offline · bench-cut: 4_NeverStarted (cut off or stopped before it "
            "started)") in result.stdout
    assert not_run_lines([load_run(bench_dir)])[0].startswith("not run in offline · bench-cut")


def confirmed_run(run_dir: Path) -> Path:
    """A search whose top two were timed again in one window, where the one second in the
    search (1.5x) came out first (2.5x against eager's 10 ms)."""
    with RunStore.create(run_dir, {"llm": {"model": None}}, "pike optimize t.py") as store:
        store.add_task("1_Add", "1_Add.py", "1" * 64, REFERENCE)
        first = add(store, "1_Add", solution("first"), "ok", 2.0, role="offline")
        second = add(store, "1_Add", solution("second"), "ok", 1.5, role="offline")
        store.set_state("1_Add", "confirmed", {"candidates": [first, second], "figures": [
            {"candidate_id": second, "runtime_ms": 4.0, "reference_ms": 10.0, "speedup": 2.5,
             "error": ""},
            {"candidate_id": first, "runtime_ms": 4.5, "reference_ms": 10.0, "speedup": 2.2,
             "error": ""}]})
    return run_dir


def test_the_confirmed_best_is_shown_with_the_search_figure_beside_it(tmp_path: Path) -> None:
    run_dir = confirmed_run(tmp_path / "run")
    run = load_run(run_dir)
    best = run.tasks[0].best()
    assert best is not None and best.verdict is not None
    assert (best.verdict.speedup, best.verdict.search_speedup) == (2.5, 1.5)
    assert final_geomean(run) == pytest.approx(2.5)
    html = build_report([run_dir], tmp_path / "out").read_text()
    row = html.split('<b>1_Add</b>')[1].split("</tr>")[0]
    assert re.search(r"2\.5×\s*<br><span class=\"tag confirmed\">confirmed</span>", row)
    assert "search: 1.5×" in row
    assert re.search(r">4\s+/ 10</td>", row)  # the confirming window's times, eager's too
    # the budget curve stays with the search's own figures, as its caption says
    assert math.isclose(max(c.verdict.speedup for c in run.tasks[0].correct()), 2.0)
