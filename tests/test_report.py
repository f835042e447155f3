"""`pike report`: figures and an HTML page built from run stores alone, which a user opens
offline and trusts to show what the runs found (and escape what the LLM wrote)."""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pike.errors import StoreError
from pike.evaluate.baseline import Baseline, ModeTiming
from pike.evaluate.verdict import TimingStats, Verdict
from pike.report import build_report
from pike.report.data import (
    final_geomean,
    fixer_success,
    lines_of_code,
    load_run,
    outcomes_by_round,
    progress,
)
from pike.store import RunStore

CHROMIUM = Path("/usr/bin/chromium")
FIGURES = ["speedup_vs_queries", "speedup_vs_dollars", "speedup_per_task",
           "outcomes_per_round", "speedup_vs_lines"]
REFERENCE = "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n" \
            "        return x + x\n"
HOSTILE = 'print("</pre><script>alert(1)</script>")'


@dataclass
class Call:
    """The attributes RunStore.record_llm_call reads from an LLM call."""

    role: str
    cost_usd: float | None
    model: str = "openai:gpt-x"
    messages: list[dict] = field(default_factory=lambda: [{"role": "user", "content": "go"}])
    reply: str = "```python\nclass ModelNew: ...\n```"
    error: str | None = None


def judged(status: str, speedup: float | None = None) -> Verdict:
    if status != "ok":
        return Verdict(status=status, message="failed", device="cpu", torch_version="2.13.0",
                       host="box")
    reference_ms = 10.0
    return Verdict(status="ok", trials=5, trials_passed=5, speedup=speedup,
                   runtime=TimingStats.from_samples([reference_ms / speedup]),
                   reference=TimingStats.from_samples([reference_ms]),
                   device="cpu", torch_version="2.13.0", host="box")


def solution(tag: str, lines: int = 1) -> str:
    body = "".join(f"        x = x * 1  # {tag}\n" for _ in range(lines))
    return ("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
            f"{body}        return x + x\n")


def add(store: RunStore, task: str, source: str, status: str, speedup: float | None = None,
        *, role: str = "optimize", round_: int = 0, call: int | None = None,
        parent: int | None = None) -> int:
    cid = store.add_candidate(task, source, parent_id=parent, role=role, round=round_,
                              branch=0, llm_call_id=call)
    store.set_verdict(cid, judged(status, speedup))
    return cid


def llm_run(run_dir: Path) -> Path:
    """Branching with an LLM over two tasks.

    1_Add: brainstorm $0.10 (no candidate), optimize $0.20 -> 2x, optimize $0.20 -> compile
    error, fix $0.10 -> 4x. 2_Mul: optimize $0.30 -> incorrect, fix $0.05 -> runtime error.
    """
    config = {"llm": {"model": "openai:gpt-x"}, "search": {"strategy": "branching"},
              "eval": {"trials": 5, "atol": 0.01, "rtol": 0.01, "model_mode": "as_constructed"}}
    with RunStore.create(run_dir, config, 'pike bench tasks/ --note "<b>bold</b>"') as store:
        for task in ("1_Add", "2_Mul"):
            store.add_task(task, f"{task}.py", task[0] * 64, REFERENCE)
        store.record_llm_call("1_Add", Call("brainstorm:0", 0.10))
        first = store.record_llm_call("1_Add", Call("optimize:0:0", 0.20))
        add(store, "1_Add", solution("two", lines=3), "ok", 2.0, call=first)
        second = store.record_llm_call("1_Add", Call("optimize:0:1", 0.20))
        broken = add(store, "1_Add", "garbage", "compile_error", call=second)
        fix = store.record_llm_call("1_Add", Call("fix:0:1:1", 0.10))
        add(store, "1_Add", HOSTILE + "\n" + solution("four", lines=5), "ok", 4.0,
            role="fix", call=fix, parent=broken)
        wrong = add(store, "2_Mul", "wrong", "incorrect",
                    call=store.record_llm_call("2_Mul", Call("optimize:0:0", 0.30)))
        add(store, "2_Mul", "crash", "runtime_error", role="fix", parent=wrong,
            call=store.record_llm_call("2_Mul", Call("fix:0:0:1", 0.05)))
    return run_dir


def offline_run(run_dir: Path) -> Path:
    """Offline only (no LLM): 1_Add 1.5x in round 1 and a wrong one in round 2; 2_Mul 0.5x;
    3_Broken's reference failed, so the campaign gave up on it. 1_Add has torch.compile
    baselines, one of which failed."""
    config = {"llm": {"model": None}, "search": {"strategy": "branching"}}
    with RunStore.create(run_dir, config, "pike bench tasks/") as store:
        for task in ("1_Add", "2_Mul", "3_Broken"):
            store.add_task(task, f"{task}.py", task[0] * 64, REFERENCE)
        store.set_state("3_Broken", "error", "the reference raised <ValueError>")
        add(store, "1_Add", solution("offline"), "ok", 1.5, role="offline", round_=1)
        add(store, "1_Add", solution("bad"), "incorrect", role="offline", round_=2)
        add(store, "2_Mul", solution("slow"), "ok", 0.5, role="offline", round_=1)
        store.set_state("1_Add", "baseline", baseline("1_Add").model_dump(mode="json"))
    return run_dir


def baseline(task: str) -> Baseline:
    eager = TimingStats.from_samples([10.0])
    return Baseline(
        task=task, task_path=f"{task}.py", task_sha256="1" * 64, device="cpu", device_name="",
        torch_version="2.13.0", host="box", date="2025-01-01T00:00:00+00:00",
        modes=[ModeTiming(mode="eager", stats=eager, speedup_vs_eager=1.0),
               ModeTiming(mode="compile:default", stats=TimingStats.from_samples([8.0]),
                          speedup_vs_eager=1.25),
               ModeTiming(mode="compile:reduce-overhead", error="inductor failed")])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    return [llm_run(root / "run-a"), offline_run(root / "run-b")]


@pytest.fixture(scope="module")
def report(runs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_report(runs, tmp_path_factory.mktemp("report") / "out")


def assert_curve(got: list[tuple[float, float]], expected: list[tuple[float, float]]) -> None:
    assert [x for x, _ in got] == pytest.approx([x for x, _ in expected])
    assert [y for _, y in got] == pytest.approx([y for _, y in expected])


def test_report_writes_every_figure_and_the_page(report: Path) -> None:
    assert report.name == "index.html"
    out = report.parent
    html = report.read_text()
    for name in FIGURES:
        png, svg = out / "figures" / f"{name}.png", out / "figures" / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in svg.read_text()[:2000]
        assert f'src="figures/{name}.png"' in html and f'href="figures/{name}.svg"' in html


def test_page_lists_the_runs_with_command_device_and_torch(report: Path) -> None:
    html = report.read_text()
    assert "branching · openai:gpt-x · run-a" in html
    assert "offline · run-b" in html
    assert "2.13.0" in html and "cpu" in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html  # the command, escaped


def test_per_task_figure_says_when_a_task_has_no_compile_baseline(report: Path) -> None:
    html = report.read_text()
    assert "No torch.compile baseline recorded for 2_Mul" in html
    assert "torch.compile reduce-overhead failed in the baseline of 1_Add" in html


def test_geomean_against_queries_is_the_best_so_far_per_task(runs: list[Path]) -> None:
    run = load_run(runs[0])
    # 1_Add: 2x at its 2nd query, 4x at its 4th; 2_Mul never correct, so 1.0x throughout
    assert_curve(progress(run, "queries"),
                 [(0, 1.0), (1, 1.0), (2, math.sqrt(2)), (3, math.sqrt(2)), (4, 2.0)])


def test_geomean_against_dollars_uses_cumulative_cost(runs: list[Path]) -> None:
    run = load_run(runs[0])
    # 2_Mul's first call ends at $0.30, as 1_Add's 2x does ($0.10 + $0.20): one step
    assert_curve(progress(run, "dollars"),
                 [(0, 1.0), (0.30, math.sqrt(2)), (0.35, math.sqrt(2)), (0.50, math.sqrt(2)),
                  (0.60, 2.0)])


def test_task_with_no_correct_candidate_counts_as_the_reference(runs: list[Path],
                                                                 report: Path) -> None:
    assert final_geomean(load_run(runs[0])) == pytest.approx(math.sqrt(4.0 * 1.0))
    html = report.read_text()
    assert re.search(r"no correct candidate</span>\s+2 tried; 1.0× fallback", html)
    assert "not run</span> its reference failed: the reference raised &lt;ValueError&gt;" in html


def test_offline_candidates_count_at_zero_queries_and_slower_ones_stay(runs: list[Path]) -> None:
    run = load_run(runs[1])
    assert run.strategy == "offline" and run.model is None
    # a correct but slower solution is what the run found: 0.5x is not lifted to 1.0x;
    # the task that failed before its search keeps the reference, 1.0x
    assert_curve(progress(run, "queries"), [(0, (1.5 * 0.5 * 1.0) ** (1 / 3))])


def test_outcomes_per_round_and_error_fixer_rate(runs: list[Path]) -> None:
    llm, offline = load_run(runs[0]), load_run(runs[1])
    assert fixer_success(llm) == (1, 2)
    assert outcomes_by_round(llm) == {
        (1, 0): {"ok": 2, "compile_error": 1, "incorrect": 1, "runtime_error": 1}}
    assert outcomes_by_round(offline) == {(0, 1): {"ok": 2}, (0, 2): {"incorrect": 1}}


def test_best_solutions_are_written_with_diffs(report: Path) -> None:
    out = report.parent
    html = report.read_text()
    source = out / "solutions" / "run1-1_Add.py"
    assert source.read_text().startswith(HOSTILE)  # the 4x fix, not the 2x one
    diff = (out / "solutions" / "run1-1_Add.diff").read_text()
    assert diff.startswith("--- 1_Add (reference)") and "+class ModelNew" in diff
    assert "-class Model(" in diff
    for href in ("solutions/run1-1_Add.py", "solutions/run1-1_Add.diff",
                 "solutions/run1-1_Add.html", "solutions/run2-2_Mul.html"):
        assert f'href="{href}"' in html
        assert (out / href).is_file()
    assert not (out / "solutions" / "run1-2_Mul.py").exists()  # nothing correct to show


def test_untrusted_solution_code_is_escaped(report: Path) -> None:
    page = (report.parent / "solutions" / "run1-1_Add.html").read_text()
    assert "<script>alert(1)" not in page and "</pre><script>" not in page
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in report.read_text()


def test_lines_of_code_skip_blanks_and_comments() -> None:
    assert lines_of_code("import torch\n\n# why\n  # more\nx = 1  # inline\n") == 2


def test_report_of_a_folder_without_a_run_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no pike run") as info:
        build_report([tmp_path / "nowhere"], tmp_path / "out")
    assert "\n" not in str(info.value)


def images_loaded_in_browser(page: Path, tmp_path: Path) -> tuple[int, int]:
    """(loaded, total) images of the page in headless Chromium, from the page's own script."""
    loaded = attributes_in_browser(page, tmp_path, ["data-images-loaded"])["data-images-loaded"]
    shown, total = loaded.split("/")
    return int(shown), int(total)


def attributes_in_browser(page: Path, tmp_path: Path, names: list[str]) -> dict[str, str]:
    """The attributes the page's own script set on <body> once loaded in headless Chromium
    (figures loaded, table rows rendered)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; CI installs it to check the page renders")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); the page's "
                    "images are not checked in a browser")
    dom = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True).stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None, dom[:2000]
    found = {name: re.search(rf'{name}="([^"]*)"', body.group(0)) for name in names}
    assert all(found.values()), f"the page's load script did not run: {body.group(0)}"
    return {name: m.group(1) for name, m in found.items() if m}


def test_the_page_shows_every_figure_in_a_headless_browser(report: Path, tmp_path: Path) -> None:
    assert images_loaded_in_browser(report, tmp_path) == (len(FIGURES), len(FIGURES))


def test_a_cut_short_verdict_is_no_task_best_in_the_report(tmp_path: Path) -> None:
    # as store.best: a window of a few rounds (over three times slower than eager, or far
    # behind the search's best) is never what the task found
    from pike.report.data import TaskRun

    def row(cid: int, verdict: Verdict) -> object:
        from types import SimpleNamespace
        return SimpleNamespace(id=cid, role="optimize", verdict=verdict, llm_call_id=None)

    cut = judged("ok", 0.3).model_copy(update={"timed_rounds": 3})
    task = TaskRun(name="t", reference="", candidates=[row(1, cut)], spend={}, queries=0,
                   dollars=0.0, uncosted_calls=0)
    assert task.best() is None and task.final_speedup() == 1.0
    task.candidates.append(row(2, judged("ok", 0.2)))
    assert task.best().id == 2 and [c.id for c in task.correct()] == [1, 2]
