"""The progress of `pike optimize`, `bench` and `audit`: live on a terminal, complete plain
lines anywhere else, with only the fields that apply to the run."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pike.audit.result import TaskAudit
from pike.evaluate.verdict import Verdict
from pike.report.progress import AUDIT_FIELDS, BenchProgress, SearchProgress, StatusFields

LLM = StatusFields.for_search("branching", uses_llm=True)
OFFLINE = StatusFields.for_search("branching", uses_llm=False)


class FakeLedger:
    def describe(self) -> str:
        return "7/300 queries, $0.42"


def piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80), out  # a file: not a terminal


def search_events(progress: SearchProgress) -> None:
    progress("round", round=2, branches=10, ledger=FakeLedger())
    progress("verdict", candidate=3, verdict=Verdict(status="ok", speedup=1.7),
             ledger=FakeLedger())
    progress("verdict", candidate=4, verdict=Verdict(status="incorrect"), ledger=FakeLedger())
    progress("rescued", branch=1, attempt=1, ledger=FakeLedger())


def test_an_llm_search_shows_round_budget_best_counts_and_rescues() -> None:
    console, out = piped()
    with SearchProgress(console, "1_GeluMLP", LLM) as progress:
        search_events(progress)
    text = out.getvalue()
    last = text.splitlines()[-1]
    assert last.endswith("1_GeluMLP: round 2 | budget 7/300 queries, $0.42 | best 1.70x | "
                         "verdicts: incorrect 1, ok 1 | rescued by fixer: 1"), last
    assert "1_GeluMLP: new best: candidate 3, 1.70x" in text


def test_plain_lines_are_whole_and_carry_no_source_location() -> None:
    console, out = piped()
    with SearchProgress(console, "a_task_with_a_long_name_that_runs_past_eighty_columns",
                        LLM) as progress:
        search_events(progress)
    text = out.getvalue()
    assert "\r" not in text and "\x1b[" not in text
    for line in text.splitlines():
        # a timestamp, then the task: never a wrapped remainder or a `progress.py:38`
        assert re.match(r"\d\d:\d\d:\d\d a_task_with_a_long_name", line), line
        assert not re.search(r"\w+\.py:\d+", line), line
        if "| best" in line:
            assert line.endswith("rescued by fixer: 0") or line.endswith("rescued by fixer: 1")


def test_an_offline_search_shows_no_budget_and_no_fixer() -> None:
    console, out = piped()
    with SearchProgress(console, "1_GeluMLP", OFFLINE) as progress:
        progress("round", round=0, branches=4)
        progress("verdict", candidate=1, verdict=Verdict(status="ok", speedup=1.2))
    text = out.getvalue()
    assert "budget" not in text and "fixer" not in text
    assert text.splitlines()[-1].endswith("1_GeluMLP: round 0 | best 1.20x | verdicts: ok 1")


def test_an_offline_search_says_which_builds_it_leaves_to_their_baseline() -> None:
    console, out = piped()
    with SearchProgress(console, "1_GeluMLP", OFFLINE) as progress:
        progress("skipped", skipped={"compile:default": "incorrect: trial 0"})
        progress("known_alone", known={"compile:reduce-overhead": 0.966})
    text = out.getvalue()
    assert "1_GeluMLP: not trying compile:default (its baseline: incorrect: trial 0)" in text
    assert ("1_GeluMLP: compile:reduce-overhead: 0.97x alone in its baseline, tried with the "
            "best set only") in text


def test_evolve_counts_generations() -> None:
    console, out = piped()
    fields = StatusFields.for_search("evolve", uses_llm=True)
    with SearchProgress(console, "t", fields) as progress:
        progress("round", round=3, branches=4, ledger=FakeLedger())
    assert "t: generation 3 | budget" in out.getvalue()


def test_a_campaign_prints_a_line_per_phase_and_the_final_state_per_task() -> None:
    console, out = piped()
    with BenchProgress(console, ["1_A", "2_B"], OFFLINE) as progress:
        progress("task_phase", task="1_A", phase="baseline")
        progress("task_phase", task="1_A", phase="search")
        # a window cut short (0.3x, over three times slower) is no best, even the first
        progress("verdict", task="1_A", candidate=9,
                 verdict=Verdict(status="ok", speedup=0.3, timed_rounds=3))
        progress("verdict", task="1_A", candidate=1, verdict=Verdict(status="ok", speedup=2.0))
        progress("task_done", task="1_A", result=None)
    lines = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == ["[baseline] 1_A: round 0 | best - | verdicts: none yet",
                     "[search] 1_A: round 0 | best - | verdicts: none yet",
                     "1_A: new best: candidate 1, 2.00x",
                     "[done] 1_A: round 0 | best 2.00x | verdicts: ok 2",
                     "[waiting] 2_B: round 0 | best - | verdicts: none yet"]


def test_a_done_search_shows_its_confirmed_best_not_its_search_time_figure() -> None:
    # On the H200 a search's [done] line said 8.33x, its search-time figure, and the next
    # call's line for the same finished task 8.67x, from the confirming window.
    from types import SimpleNamespace

    console, out = piped()
    with BenchProgress(console, ["1_A"], OFFLINE) as progress:
        progress("verdict", task="1_A", candidate=1, verdict=Verdict(status="ok", speedup=8.33))
        confirmed = Verdict(status="ok", speedup=8.67, confirmed=True, search_speedup=8.2)
        progress("task_done", task="1_A", result=SimpleNamespace(best_verdict=confirmed))
    assert "[done] 1_A: round 0 | best 8.67x | verdicts: ok 1" in out.getvalue()


def test_an_audit_shows_each_file_s_verdict_not_search_fields() -> None:
    console, out = piped()
    with BenchProgress(console, ["1_A"], AUDIT_FIELDS) as progress:
        progress("task_phase", task="1_A", phase="evaluate")
        progress("task_done", task="1_A",
                 audit=TaskAudit(task="1_A", status="ok", speedup=1.5))
    text = out.getvalue()
    assert "round" not in text and "verdicts" not in text
    assert text.splitlines()[-1].endswith("[done] 1_A: ok 1.50x")


def test_each_baseline_mode_s_build_is_a_line_of_its_own() -> None:
    console, out = piped()
    with BenchProgress(console, ["10_ResNet101"], AUDIT_FIELDS) as progress:
        progress("task_phase", task="10_ResNet101", phase="baseline")
        progress("mode_built", task="10_ResNet101", mode="compile:default", build_s=61.04,
                 error=None)
        progress("mode_built", task="10_ResNet101", mode="compile:max-autotune", build_s=300.2,
                 error="timeout in phase 'timing': no progress for 300 s")
        progress("mode_built", task="10_ResNet101", mode="compile:default", build_s=12.06,
                 error="incorrect: trial 0, output 0: 4482 of 10000 values outside",
                 again=True)
        progress("mode_built", task="10_ResNet101", mode="compile:reduce-overhead",
                 build_s=None, error="  ")
        progress("mode_built", task="10_ResNet101", mode="compile:max-autotune", build_s=60.5,
                 error=None, prebuild_s=52.25)
        progress("mode_built", task="10_ResNet101", mode="compile:max-autotune", build_s=80.0,
                 error="crashed in phase 'build': SIGSEGV", prebuild_s=80.0)
        progress("prebuild_failed", task="10_ResNet101", mode="compile:max-autotune",
                 error="crashed in phase 'build': SIGSEGV")
    lines = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines[-3:] == [
        "10_ResNet101: baseline compile:max-autotune built in 60.5 s (8.2 s of it with the "
        "device alone)",
        "10_ResNet101: baseline compile:max-autotune failed in 80.0 s: crashed in phase "
        "'build': SIGSEGV",
        "10_ResNet101: baseline compile:max-autotune: its pre-build took the reference's "
        "child down (crashed in phase 'build': SIGSEGV); built again alone, without one"]
    assert lines[1:-3] == [
        "10_ResNet101: baseline compile:default built in 61.0 s",
        "10_ResNet101: baseline compile:max-autotune failed in 300.2 s: timeout in phase "
        "'timing': no progress for 300 s",
        "10_ResNet101: baseline compile:default built in 12.1 s (again, in a new child), but "
        "is incorrect: trial 0, output 0: 4482 of 10000 values outside",
        "10_ResNet101: baseline compile:reduce-overhead failed: no reason given"]


def test_a_failed_build_always_says_why() -> None:
    from types import SimpleNamespace

    from pike.evaluate.baseline import _why

    def timer(error: str | None = None, failure: object = None) -> SimpleNamespace:
        return SimpleNamespace(error=error, failure=failure)

    assert _why(timer()) is None  # built
    assert _why(timer(error="RuntimeError: boom\nmore")) == "RuntimeError: boom"
    assert _why(timer(failure=Verdict(status="crashed", message=""))) == "crashed"
    assert _why(timer(failure=Verdict(status="timeout", message="  \n"))) == "timeout"


def test_an_error_ends_the_display_without_a_status_line() -> None:
    console, out = piped()
    try:
        with SearchProgress(console, "t", LLM):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert out.getvalue() == ""  # the error's own line is all the user needs


def test_a_terminal_gets_the_live_display() -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True)
    with SearchProgress(console, "1_GeluMLP", LLM) as progress:
        search_events(progress)
    text = out.getvalue()
    assert "\x1b[" in text  # redrawn in place
    assert "rescued by fixer: 1" in text and "new best: candidate 3" in text


class _ClosedPipe(io.StringIO):
    closed_now = False

    def write(self, text: str) -> int:
        if self.closed_now:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


def test_a_closed_terminal_does_not_hide_the_ctrl_c_being_unwound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pike ... | head` or a closed terminal, then Ctrl-C: the live display's last
    render fails (rich turns a broken pipe into SystemExit(1)), and the interrupt, which
    the command line turns into a prompt exit, must still reach it."""
    # rich points stdout's descriptor at /dev/null on a broken pipe: not pytest's
    monkeypatch.setattr(sys, "stdout", (tmp_path / "stdout").open("w"))
    out = _ClosedPipe()
    console = Console(file=out, width=80, force_terminal=True)
    with pytest.raises(KeyboardInterrupt), BenchProgress(console, ["1_A"], OFFLINE) as progress:
        progress("phase", task="1_A", phase="baselines")
        out.closed_now = True
        raise KeyboardInterrupt
    out.closed_now = False
    console.quiet = False
    with pytest.raises(SystemExit), BenchProgress(console, ["1_A"], OFFLINE):
        out.closed_now = True  # a run that ended well says so, or fails loudly
