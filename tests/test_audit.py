"""`audit()`: every solution file re-judged with the full guards, per-task verdicts that say
why a file failed, and aggregates where a failing or missing file counts 1.0x.

One real audit (module fixture, CPU, about 25 s) of tests/audit_set/mixed: a correct file
(task_1.py), a wrong one (2_*.py), a seed-dependent one (3_*.py, replays its first answer),
a crashing one (task_10.py, os._exit), a task with no file (4_Negate) and a stray file.
The rest runs with the evaluator replaced, to check arithmetic and wiring quickly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from pike.audit import AuditResult, audit, detect_precision, match_solutions, to_markdown
from pike.audit import run as audit_run
from pike.audit.matching import match
from pike.config import RunConfig
from pike.errors import ConfigError, TaskError
from pike.evaluate import Baseline, ModeTiming, TimingStats, Verdict
from pike.evaluate.device_identity import identity
from pike.report.data import load_run
from pike.store import RunStore
from pike.task import Task, load_tasks

AUDIT_SET = Path(__file__).resolve().parent / "audit_set"
TASKS = AUDIT_SET / "tasks"
MIXED = AUDIT_SET / "mixed"


def audit_config(build_cache: Path, modes: list[str] | None = None) -> RunConfig:
    """The fast CPU protocol of tests/conftest.py's run_config."""
    return RunConfig.model_validate({
        "eval": {"device": "cpu", "trials": 2, "build_cache": str(build_cache),
                 "timing": {"warmup_calls": 1, "warmup_seconds": 0.0, "min_calls": 5,
                            "min_seconds": 0.02, "rounds": 2},
                 "limits": {"load_seconds": 120, "check_seconds": 30, "timing_seconds": 60,
                            "memory_gib": 2}},
        "search": {"baseline_modes": modes or ["eager"]},
    })


# The mixed set's figures are timed for real on this host: beside another test process on
# CI's two cores, 1_Scale's figure was withheld as noisy (a clean-clone CI of 2026-12-07,
# five tests failing at once), so every test of it runs in the alone phase.
MIXED_IS_TIMED = pytest.mark.timing


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory,
          build_cache: Path) -> tuple[AuditResult, Path, list[tuple[str, str, str]]]:
    out = tmp_path_factory.mktemp("audit") / "run"
    events: list[tuple[str, str, str]] = []
    result = audit(MIXED, TASKS, audit_config(build_cache), out=out, command="pike audit",
                   on_event=lambda kind, **d: events.append((kind, d["task"], d.get("phase", ""))))
    return result, out, events


def by_task(result: AuditResult) -> dict[str, Any]:
    return {t.task: t for t in result.tasks}


# -- the real audit -----------------------------------------------------------------------


@MIXED_IS_TIMED
def test_each_file_gets_its_verdict_and_failing_check(mixed: Any) -> None:
    result, _, _ = mixed
    t = by_task(result)
    assert list(t) == ["1_Scale", "2_Softplus", "3_RowSum", "4_Negate", "10_Square"]
    assert [t[n].file for n in t] == ["task_1.py", "2_softplus_relu.py", "3_rowsum_cached.py",
                                      None, "task_10.py"]
    ok = t["1_Scale"]
    assert ok.status == "ok" and (ok.trials_passed, ok.trials) == (2, 2)
    assert ok.speedup > 1.5  # one multiply against twenty
    assert ok.precision == ["tf32"]  # it sets allow_tf32
    wrong = t["2_Softplus"]
    assert (wrong.status, wrong.phase, wrong.trials_passed) == ("incorrect", "check", 0)
    assert not wrong.seed_dependent
    assert [e.label for e in wrong.trial_errors][:2] == ["trial 0", "trial 1"]
    # ReLU misses softplus by ln 2 at 0, which the plain trials' randn always comes near; the
    # shifted trial's scale and shift are drawn unpredictably and can keep every input far
    # from 0, where the two agree within the tolerance, so it is not asserted on.
    plain = [e for e in wrong.trial_errors if e.label.startswith("trial ")]
    assert len(plain) == 2 and all(e.max_abs_error > 0.5 and e.max_rel_error for e in plain)
    assert wrong.speedup is None and wrong.precision == []
    seed = t["3_RowSum"]
    assert (seed.status, seed.trials_passed, seed.trials) == ("incorrect", 1, 2)
    assert seed.seed_dependent
    assert [e.trial for e in seed.trial_errors][0] == 1  # trial 0 passed
    assert t["4_Negate"].status == "missing"
    crash = t["10_Square"]
    assert (crash.status, crash.phase) == ("crashed", "check")
    assert "exited with status 3" in crash.message


@MIXED_IS_TIMED
def test_aggregates_count_every_failure_as_one(mixed: Any) -> None:
    result, _, _ = mixed
    agg = result.aggregates
    s = by_task(result)["1_Scale"].speedup
    assert (agg.tasks, agg.correct, agg.failed, agg.missing, agg.errors) == (5, 1, 3, 1, 0)
    assert agg.geomean_all == pytest.approx(s ** (1 / 5))  # four tasks at 1.0x
    assert agg.geomean_correct == pytest.approx(s)
    assert agg.claimed_geomean == 2.5 and "claimed.json" in agg.claimed_source
    assert agg.modes == []  # eager only in this config
    assert any("99_stray.py" in w for w in result.warnings)


@MIXED_IS_TIMED
def test_everything_is_in_the_run_store(mixed: Any) -> None:
    result, out, events = mixed
    with RunStore.open(out) as store:
        assert store.command() == "pike audit"
        assert [row["name"] for row in store.tasks()] == [t.task for t in result.tasks]
        rows = store.candidates()
        assert [(r.task, r.role, r.idea) for r in rows] == [
            ("1_Scale", "audit", "task_1.py"), ("2_Softplus", "audit", "2_softplus_relu.py"),
            ("3_RowSum", "audit", "3_rowsum_cached.py"), ("10_Square", "audit", "task_10.py")]
        assert [r.verdict.status for r in rows] == ["ok", "incorrect", "incorrect", "crashed"]
        assert rows[0].source == (MIXED / "task_1.py").read_text()
        for task in result.tasks:
            if task.status == "missing":  # nothing to compare: no baseline timed
                assert store.get_state(task.task, "baseline") is None
                continue
            baseline = Baseline.model_validate(store.get_state(task.task, "baseline"))
            assert [m.mode for m in baseline.modes] == ["eager"]
            # the child names the physical device, so a resumed call can tell it is the same
            assert baseline.device_id == identity("cpu") != ""
        assert store.get_state("4_Negate", "missing") is True
        assert store.get_state("1_Scale", "missing") is None
        assert all(store.get_state(t.task, "done") for t in result.tasks)
    assert ("task_phase", "4_Negate", "baseline") not in events
    assert ("task_phase", "4_Negate", "evaluate") not in events
    assert [e[1] for e in events if e[0] == "task_done"] == [t.task for t in result.tasks]
    # the JSON beside the store is the result; the report sees the failures as 1.0x
    assert AuditResult.model_validate_json((out / "audit.json").read_text()) == result
    run = load_run(out)
    assert [t.name for t in run.tasks if t.best() is None] == [
        "2_Softplus", "3_RowSum", "4_Negate", "10_Square"]
    assert [t.name for t in run.tasks if t.baseline is None] == ["4_Negate"]


@MIXED_IS_TIMED
def test_markdown_leads_with_the_all_task_geomean_and_spells_out_failures(mixed: Any) -> None:
    result, out, _ = mixed
    page = to_markdown(result)
    assert (out / "audit.md").read_text() == page
    s = by_task(result)["1_Scale"].speedup
    assert f"all 5 tasks: {s ** 0.2:.3g}×**" in page
    assert f"1 correct file only: {s:.3g}×" in page
    assert "Claimed geomean: 2.5×" in page
    assert "incorrect (seed-dependent: 1/2 trials passed)" in page
    assert "exited with status 3" in page
    assert "1 correct, 3 failed (2 incorrect, 1 crashed), 1 missing" in page
    assert "| 4_Negate | — | missing |" in page
    assert "99_stray.py: matches no task" in page


@MIXED_IS_TIMED
def test_markdown_names_the_files_correct_by_the_float64_rule(mixed: Any) -> None:
    result, _, _ = mixed
    assert "Correct by the float64 rule" not in to_markdown(result)
    tasks = [t.model_copy(update={"rounding_passed": 3}) if t.task in ("1_Scale", "3_RowSum")
             else t for t in result.tasks]
    page = to_markdown(result.model_copy(update={"tasks": tasks}))
    assert "## Correct by the float64 rule" in page
    assert "- 1_Scale: 3 values" in page
    assert "3_RowSum: 3 values" not in page  # incorrect: the rule did not pass it


# -- matching files to tasks -----------------------------------------------------------------


def _files(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("# a solution\n")
    return folder


def _names(found: dict[str, Path | None]) -> dict[str, str | None]:
    return {task: path.name if path else None for task, path in found.items()}


def test_matching_by_file_names(tmp_path: Path) -> None:
    tasks = load_tasks(TASKS)
    folder = _files(tmp_path, "task_10.py", "1_my_scale.py", "2_Softplus.py", "task_2.py",
                    "_helpers.py", "30_other.py")
    assert _names(match_solutions(folder, tasks)) == {
        "1_Scale": "1_my_scale.py",        # KernelBench style: id prefix, any name
        "2_Softplus": "2_Softplus.py",     # the exact task name wins over task_2.py
        "3_RowSum": None, "4_Negate": None,
        "10_Square": "task_10.py",         # 1_*.py does not take task 10's file
    }
    _files(tmp_path, "10_square_v2.py")
    with pytest.raises(ConfigError, match="2 files fit task 10_Square"):
        match_solutions(folder, tasks)


def test_matching_by_mapping_file(tmp_path: Path) -> None:
    tasks = load_tasks(TASKS)
    folder = _files(tmp_path, "fast.py", "neg.py", "task_3.py")
    (folder / "mapping.yaml").write_text(yaml.safe_dump(
        {"1_Scale": "fast.py", 4: "neg.py", "10": "gone.py", "77": "fast.py"}))
    assert _names(match_solutions(folder, tasks)) == {
        "1_Scale": "fast.py", "2_Softplus": None,
        "3_RowSum": None,  # a mapping is the whole truth: task_3.py is not guessed
        "4_Negate": "neg.py", "10_Square": None}
    found = match(folder, tasks)
    assert found.how == "mapping.yaml"
    assert any("gone.py does not exist" in n for n in found.notes)
    assert any("77 names none" in n for n in found.notes)
    (folder / "mapping.yaml").write_text("- fast.py\n")
    with pytest.raises(ConfigError, match="must map task names or ids"):
        match_solutions(folder, tasks)


# -- precision -----------------------------------------------------------------------------


def test_precision_detected_from_source_and_flags() -> None:
    assert detect_precision("y = x.half()\nz = y.to(torch.bfloat16)\n") == ["fp16", "bf16"]
    assert detect_precision("with torch.autocast('cuda'):\n    y = f(x)\n") == ["autocast"]
    assert detect_precision("torch.set_float32_matmul_precision('high')\n") == ["tf32"]
    assert detect_precision('src = "__global__ void k(__half* x) {}"\n') == ["fp16"]
    assert detect_precision("y = x * 2  # TODO try .half() or bfloat16\n") == []
    # the task's own dtype is the contract, not a lowered precision
    assert detect_precision("x.to(torch.float16)", reference="x = torch.float16") == []
    flags = Verdict(status="ok", flags_changed={"cudnn.allow_tf32": "False -> True"})
    assert detect_precision("y = x", verdict=flags) == ["tf32"]


# -- wiring, with the evaluator replaced ------------------------------------------------------


def fake_baseline(task: Task, compile_speedup: float | None,
                  checked: bool | None = True) -> Baseline:
    stats = TimingStats.from_samples([1.0])
    modes = [ModeTiming(mode="eager", stats=stats, speedup_vs_eager=1.0)]
    if compile_speedup is None:
        modes.append(ModeTiming(mode="compile:default", error="compile failed"))
    else:
        modes.append(ModeTiming(mode="compile:default", stats=stats, checked=checked,
                                speedup_vs_eager=compile_speedup))
    return Baseline(task=task.name, task_path=str(task.path), task_sha256=task.sha256,
                    device="cpu", device_name="fake", torch_version="0", host="h", date="d",
                    modes=modes)


def fake_ok(speedup: float) -> Verdict:
    return Verdict(status="ok", trials_passed=2, trials=2, speedup=speedup, device="cpu",
                   runtime=TimingStats.from_samples([1.0 / speedup]),
                   reference=TimingStats.from_samples([1.0]))


class FakeJudge:
    """Stands in for measure_baselines and evaluate; records what the audit asked."""

    def __init__(self, compile_speedups: dict[str, float | None], verdicts: dict[str, Verdict],
                 broken: tuple[str, ...] = ()) -> None:
        self.compile_speedups, self.verdicts, self.broken = compile_speedups, verdicts, broken
        self.modes: list[list[str]] = []
        self.configs: list[RunConfig] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeJudge:
        monkeypatch.setattr(audit_run, "measure_baselines", self.measure)
        monkeypatch.setattr(audit_run, "evaluate", self.evaluate)
        return self

    def measure(self, task: Task, cfg: RunConfig, modes: list[str], **_: Any) -> Baseline:
        self.modes.append(modes)
        if task.name in self.broken:
            raise TaskError(f"{task.path}: reference failed in phase 'check': boom")
        baseline = fake_baseline(task, self.compile_speedups.get(task.name))
        baseline.modes = [m for m in baseline.modes if m.mode in modes]  # those asked only
        return baseline

    def evaluate(self, task: Task, source: str, cfg: RunConfig) -> Verdict:
        self.configs.append(cfg)
        return self.verdicts[task.name]


def test_compile_speedups_guards_and_reference_errors(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    judge = FakeJudge({"1_Scale": 2.0, "2_Softplus": 4.0, "3_RowSum": None},
                      {"1_Scale": fake_ok(3.0),
                       "2_Softplus": Verdict(status="incorrect", trials=2, phase="check"),
                       "3_RowSum": fake_ok(0.5)},
                      broken=("10_Square",)).install(monkeypatch)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py", "task_3.py", "task_10.py")
    cfg = audit_config(build_cache, ["eager", "compile:default"])
    cfg.eval.guards = False
    result = audit(folder, TASKS, cfg, out=tmp_path / "run", ids=[1, 2, 3, 10])
    assert judge.modes == [["eager", "compile:default"]] * 4
    assert all(c.eval.guards for c in judge.configs)  # an audit never runs without guards
    assert any("guards" in w for w in result.warnings)
    t = by_task(result)
    assert t["1_Scale"].compile_speedups == {"compile:default": pytest.approx(1.5)}
    assert t["2_Softplus"].compile_speedups == {}
    assert t["3_RowSum"].compile_speedups == {}  # the mode failed: no ratio to take
    assert (t["10_Square"].status, "boom" in t["10_Square"].message) == ("error", True)
    agg = result.aggregates
    assert (agg.correct, agg.failed, agg.errors) == (2, 1, 1)
    assert agg.geomean_all == pytest.approx((3.0 * 1.0 * 0.5 * 1.0) ** 0.25)
    assert agg.geomean_correct == pytest.approx(math.sqrt(3.0 * 0.5))
    # over compile: the tasks where the mode ran, the incorrect one at 1.0x
    [mode] = agg.modes
    assert (mode.mode, mode.tasks) == ("compile:default", 2)
    assert mode.geomean == pytest.approx(math.sqrt(1.5))
    with RunStore.open(tmp_path / "run") as store:
        assert "boom" in store.get_state("10_Square", "error")
    summary = json.loads((tmp_path / "run" / "audit.json").read_text())["aggregates"]
    assert summary["errors"] == 1


def test_each_tasks_idle_reference_is_closed_once_its_audit_ends(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No file of an audited task is judged again, and its kept reference child held the
    # GPU memory the next task's candidate needed (an H100 audit of level5 ran out so).
    FakeJudge({}, {"1_Scale": fake_ok(2.0)}, broken=("10_Square",)).install(monkeypatch)
    closed: list[str] = []
    monkeypatch.setattr(audit_run, "close_idle_references",
                        lambda of: closed.append(of.name) or 0)
    folder = _files(tmp_path / "set", "task_1.py", "task_10.py")
    audit(folder, TASKS, audit_config(build_cache, ["eager"]), out=tmp_path / "run",
          ids=[1, 10])
    assert closed == ["1_Scale", "10_Square"]  # the one whose reference failed, too


def test_the_geomean_over_each_tasks_fastest_compile_mode_and_who_falls_below_it() -> None:
    from pike.audit.result import TaskAudit, aggregate

    stats = TimingStats.from_samples([1.0])

    def baseline(name: str, speedups: dict[str, float | None]) -> Baseline:
        modes = [ModeTiming(mode="eager", stats=stats, speedup_vs_eager=1.0)]
        modes += [ModeTiming(mode=m, stats=stats, speedup_vs_eager=x) if x else
                  ModeTiming(mode=m, error="compile failed") for m, x in speedups.items()]
        return Baseline(task=name, task_path=name, task_sha256="0", device="cuda:0",
                        device_name="fake", torch_version="0", host="h", date="d", modes=modes)

    a, b, c, d = "1_A", "2_B", "3_C", "4_D"
    baselines = {a: baseline(a, {"compile:default": 2.0, "compile:max-autotune": 4.0}),
                 b: baseline(b, {"compile:default": 2.0, "compile:max-autotune": None}),
                 c: baseline(c, {"compile:default": 2.0}),
                 d: baseline(d, {"compile:default": None})}
    tasks = [
        # 6x eager: 3x over default, 1.5x over max-autotune, its fastest mode
        TaskAudit(task=a, status="ok", speedup=6.0,
                  compile_speedups={"compile:default": 3.0, "compile:max-autotune": 1.5}),
        # the failed mode does not count: 0.9x over default, its fastest working mode
        TaskAudit(task=b, status="ok", speedup=1.8, compile_speedups={"compile:default": 0.9}),
        TaskAudit(task=c, status="incorrect"),  # counts 1.0x: the user keeps torch.compile
        TaskAudit(task=d, status="ok", speedup=2.0),  # no working mode: not in the geomean
    ]
    agg = aggregate(tasks, baselines, None)
    assert agg.best_compile is not None
    assert (agg.best_compile.mode, agg.best_compile.tasks) == ("best", 3)
    assert agg.best_compile.geomean == pytest.approx((1.5 * 0.9 * 1.0) ** (1 / 3))
    assert agg.below_best_compile == {b: pytest.approx(0.9)}
    result = AuditResult(solutions="s", tasks_dir="t", matched_by="file names", run_dir="r",
                         device="cuda:0",
                         device_name="fake", torch_version="0", host="h", date="d",
                         protocol="p", tasks=tasks, aggregates=agg)
    text = to_markdown(result)
    assert "fastest torch.compile mode: 1.11× (3 tasks" in text
    assert "slower than their task's fastest torch.compile mode: 2_B 0.9×\n" in text

    # an offline file of that very mode: the page says the two are builds of one code
    tasks[1].transformations = ["compile:default"]
    assert tasks[1].is_its_fastest_compile_mode()
    assert ("slower than their task's fastest torch.compile mode: 2_B 0.9× (the file is "
            "that mode, compiled again)") in to_markdown(result)
    tasks[0].transformations = ["compile:default"]  # not its fastest mode (max-autotune)
    assert not tasks[0].is_its_fastest_compile_mode()

    # a task without a file has no baseline measured (a set that kept its reference): it
    # counts 1.0x over every mode, as the user keeping torch.compile, instead of leaving
    # the compile geomeans; a task whose baseline found no working mode still stays out
    kept = TaskAudit(task="5_E", status="missing", message="the reference is kept")
    agg = aggregate([*tasks, kept], baselines, None)
    assert agg.best_compile is not None and agg.best_compile.tasks == 4
    assert agg.best_compile.geomean == pytest.approx((1.5 * 0.9 * 1.0 * 1.0) ** (1 / 4))
    default = next(m for m in agg.modes if m.mode == "compile:default")
    assert default.tasks == 4 and default.geomean == pytest.approx((3.0 * 0.9 * 1.0) ** (1 / 4))


def test_the_page_says_what_holds_the_figure_back_and_how_far_each_task_is_from_its_floor(
        ) -> None:
    """Each task's distance from its floor is worked out from the work its baseline counted
    (the floor's model of today, not the one kept with the baseline), for the file and for
    eager; the page lists the tasks below their fastest compile mode and the lowest over
    eager with it, and the aggregates keep the geomeans."""
    from pike.audit.result import TaskAudit, aggregate, task_audit
    from pike.floor import Work, floor

    h200 = "NVIDIA H200"
    work = Work(flops=10**12, flops_by_op={"aten.convolution": 10**12}, bytes_min=10**6)
    at = floor(work, h200)
    assert at is not None and at.tf32_flops == 10**12

    def baseline(name: str, eager_ms: float, kept_floor: bool = True) -> Baseline:
        modes = [ModeTiming(mode="eager", stats=TimingStats.from_samples([eager_ms]),
                            speedup_vs_eager=1.0),
                 ModeTiming(mode="compile:default", stats=TimingStats.from_samples([1.0]),
                            speedup_vs_eager=eager_ms)]
        stale = at.model_copy(update={"ms": 99.0})  # as an older pike worked it out
        return Baseline(task=name, task_path=name, task_sha256="0", device="cuda:0",
                        device_name=h200, torch_version="0", host="h", date="d", modes=modes,
                        work=work, floor=stale if kept_floor else None)

    def verdict(ms: float) -> Verdict:
        return Verdict(status="ok", runtime=TimingStats.from_samples([ms]), speedup=1.0)

    a = task_audit(TaskAudit(task="1_A", status="missing"), verdict(4 * at.ms),
                   baseline("1_A", 20 * at.ms))
    assert a.floor_ms == pytest.approx(at.ms) and a.lowp_floor_ms == pytest.approx(at.lowp_ms)
    assert a.times_floor == pytest.approx(4.0) and a.eager_times_floor == pytest.approx(20.0)
    failed = task_audit(TaskAudit(task="2_B", status="missing"),
                        Verdict(status="incorrect", trials=5), baseline("2_B", 3 * at.ms))
    assert failed.times_floor is None and failed.eager_times_floor == pytest.approx(3.0)
    # no work counted (a CPU baseline, an unknown card): no distance, and no error
    bare = baseline("3_C", 1.0, kept_floor=False).model_copy(update={"work": None})
    assert task_audit(TaskAudit(task="3_C", status="missing"), verdict(1.0), bare).floor_ms \
        is None
    a.compile_speedups = {"compile:default": 0.5}  # half as fast as compile default
    agg = aggregate([a, failed], {}, None)
    assert agg.times_floor is not None and agg.times_floor.tasks == 1
    assert (agg.times_floor.geomean, agg.times_floor.eager) == (pytest.approx(4.0),
                                                               pytest.approx(20.0))
    agg.below_best_compile = {"1_A": 0.5}
    page = to_markdown(AuditResult(solutions="s", tasks_dir="t", matched_by="m", run_dir="r",
                                   date="d", protocol="p", tasks=[a, failed], aggregates=agg))
    held = page.split("## What holds it back")[1].split("## Tasks")[0]
    assert "- 1_A: ok, 1× over eager, 0.5× its fastest compile mode (default), 4× floor " \
           "(eager 20×)" in held
    assert "- 2_B: incorrect, 1× over eager, file untimed (eager 3×)" in held
    assert "geomean over the 1 correct file with one: 4× their floor; eager 20× the " \
        "task's floor" in page
    assert "| 4× floor (eager 20×) |" in page  # the table's column
    # a file in lower precision is held to the tensor-core floor, which is lower
    lowp = task_audit(TaskAudit(task="1_A", status="missing", precision=["fp16"]),
                      verdict(4 * at.ms), baseline("1_A", 20 * at.ms))
    assert lowp.floor_is_lowp and lowp.times_floor == pytest.approx(4 * at.ms / at.lowp_ms)
    assert lowp.times_floor > 4.0 and lowp.eager_times_floor == pytest.approx(20.0)
    page = to_markdown(AuditResult(solutions="s", tasks_dir="t", matched_by="m", run_dir="r",
                                   date="d", protocol="p", tasks=[lowp],
                                   aggregates=aggregate([lowp], {}, None)))
    assert "tensor-core floor (eager 20×)" in page
    assert "(the tensor-core floor for the 1 in lower precision)" in page
    # fp8 has no floor on file that bounds it; a half-precision task's two floors are one
    fp8 = task_audit(TaskAudit(task="1_A", status="missing", precision=["fp8"]),
                     verdict(4 * at.ms), baseline("1_A", 20 * at.ms))
    assert not fp8.floor_is_lowp and fp8.times_floor == pytest.approx(4.0)
    half_work = work.model_copy(update={"dtype": "bf16"})
    half = task_audit(TaskAudit(task="1_A", status="missing", precision=["bf16"]),
                      verdict(1.0), baseline("1_A", 2.0).model_copy(update={"work": half_work}))
    assert not half.floor_is_lowp and half.floor_ms == half.lowp_floor_ms


def test_unsteady_timings_are_named_with_how_to_measure_them_again() -> None:
    """The H100's level1 audit timed a 60-microsecond task at 0.75x of eager, its calls'
    quartiles 70% of the median apart (the search: 1.26x, 4%): a figure like that is named,
    with the spreads it rests on and the command that measures it again; a steady one is
    not."""
    from pike.audit.result import TaskAudit, aggregate, task_audit

    def stats(median: float, spread: float) -> TimingStats:
        return TimingStats(median_ms=median, q1_ms=median * (1 - spread / 2),
                           q3_ms=median * (1 + spread / 2), min_ms=median / 2,
                           mean_ms=median, count=100)

    def baseline(name: str, spread: float) -> Baseline:
        return Baseline(task=name, task_path=name, task_sha256="0", device="cuda:0",
                        device_name="fake", torch_version="0", host="h", date="d", modes=[
                            ModeTiming(mode="eager", stats=stats(1.0, 0.04),
                                       speedup_vs_eager=1.0),
                            ModeTiming(mode="compile:default", stats=stats(2.0, spread),
                                       speedup_vs_eager=0.5)])

    shaky = task_audit(TaskAudit(task="12_Diag", task_id=12, status="missing"), Verdict(
        status="ok", speedup=0.75, runtime=stats(0.11, 0.7), reference=stats(0.08, 0.45)),
        baseline("12_Diag", 0.86))
    steady = task_audit(TaskAudit(task="9_Tall", task_id=9, status="missing"), Verdict(
        status="ok", speedup=1.5, runtime=stats(2.0, 0.05), reference=stats(3.0, 0.04)),
        baseline("9_Tall", 0.05))
    failed = task_audit(TaskAudit(task="3_Bad", task_id=3, status="missing"),
                        Verdict(status="incorrect", runtime=stats(1.0, 0.9),
                                reference=stats(1.0, 0.9)), baseline("3_Bad", 0.9))
    assert shaky.unsteady() == {"file": pytest.approx(0.7), "eager": pytest.approx(0.45),
                                "baseline compile:default": pytest.approx(0.86)}
    assert shaky.spreads["baseline eager"] == pytest.approx(0.04)
    assert not steady.unsteady()
    # an incorrect file counts 1.0x whatever was timed: no figure of it rests on a spread
    assert failed.spreads == {}
    agg = aggregate([shaky, steady, failed], {}, None)
    assert agg.unsteady == ["12_Diag"]
    page = to_markdown(AuditResult(solutions="s", tasks_dir="t", matched_by="m",
                                   run_dir="runs/a1", date="d", protocol="p",
                                   tasks=[shaky, steady, failed], aggregates=agg))
    line = next(ln for ln in page.splitlines() if ln.startswith("- Unsteady timings"))
    assert "quartiles more than 25% of the median apart" in line
    assert ("12_Diag (file 70%, eager 45%, baseline compile:default 86%); `pike audit "
            "--resume runs/a1 --redo 12` measures them again") in line
    assert "9_Tall" not in line
    combined = to_markdown(AuditResult(solutions="s", tasks_dir="t", matched_by="m",
                                       run_dir="runs/ab", date="d", protocol="p",
                                       tasks=[shaky], aggregates=agg,
                                       combined_from=["runs/a", "runs/b"]))
    assert ("`pike audit --resume RUN --redo 12` (RUN: the part's run that judged it) "
            "measures them again") in combined
    steady_page = to_markdown(AuditResult(solutions="s", tasks_dir="t", matched_by="m",
                                          run_dir="r", date="d", protocol="p", tasks=[steady],
                                          aggregates=aggregate([steady], {}, None)))
    assert "Unsteady" not in steady_page


def test_an_offline_files_marker_names_its_transformations() -> None:
    from pike.agents.offline import named_in, render

    source = render("import torch\n\nclass Model(torch.nn.Module):\n    pass\n",
                    ("compile:max-autotune-no-cudagraphs", "tf32"))
    assert named_in(source) == ["tf32", "compile:max-autotune-no-cudagraphs"]
    assert named_in("class ModelNew: pass\n") == []
    assert named_in("# ---- pike offline transformation: rm -rf ----\n") == []


@MIXED_IS_TIMED
def test_cli_audits_exports_a_set_and_reports(mixed: Any, tmp_path: Path,
                                              build_cache: Path) -> None:
    from tests.test_optimize import pike

    _, out, _ = mixed
    config = tmp_path / "audit.yaml"
    config.write_text(yaml.safe_dump(audit_config(build_cache).model_dump(mode="json")))
    exported = tmp_path / "set"
    result = pike("export", out, "--set", exported)
    assert result.exit_code == 0, result.output
    assert (exported / "manifest.json").exists() and (exported / "1_Scale.py").exists()
    again = tmp_path / "again"
    result = pike("audit", exported, TASKS, "--tasks", "1", "--json", "--config", config,
                  "--out", again)
    assert result.exit_code == 0, result.output
    audited = json.loads(result.output[result.output.index("{"):])
    assert [t["status"] for t in audited["tasks"]] == ["ok"], [
        (t["phase"], t["message"]) for t in audited["tasks"]]
    assert audited["aggregates"]["claimed_geomean"] is not None  # the set carries its figure
    report = tmp_path / "report"
    assert pike("report", out, again, "--out", report).exit_code == 0
    assert load_run(out).strategy == "audit"
    assert "audit" in (report / "index.html").read_text()
    assert pike("export", out, "1_Scale", "--set", exported).exit_code == 2


def test_an_audit_cut_off_keeps_the_tasks_it_judged(tmp_path: Path, build_cache: Path) -> None:
    out = tmp_path / "cut"

    def stop_after_the_first(kind: str, **data: Any) -> None:
        if kind == "task_done":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        audit(MIXED, TASKS, audit_config(build_cache), out=out, ids=[1, 4],
              on_event=stop_after_the_first)
    kept = AuditResult.model_validate_json((out / "audit.json").read_text())
    assert [t.task for t in kept.tasks] == ["1_Scale"]
    assert "partial: 1 of 2 tasks audited so far" in kept.warnings


@MIXED_IS_TIMED
def test_tasks_audited_at_once_get_the_same_verdicts_in_task_order(
        mixed: Any, tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import judge

    serial, _, _ = mixed
    cfg = audit_config(build_cache)
    cfg.eval.workers = 3
    # no forged check: beside the other tasks' children, load on 1_Scale's one block looks forged
    monkeypatch.setattr(judge, "_forged", lambda *a, **k: None)
    together = audit(MIXED, TASKS, cfg, out=tmp_path / "parallel")
    assert [(t.task, t.status, t.phase) for t in together.tasks] == [
        (t.task, t.status, t.phase) for t in serial.tasks]
    assert together.aggregates.correct == serial.aggregates.correct


def test_an_audit_cut_off_goes_on_with_resume_and_keeps_what_it_judged(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long audit spans device calls: cut off after its first task, `resume` measures
    and judges only the rest, and the result covers every task as one audit would."""
    from pike.audit import resume_audit
    from tests.test_optimize import pike

    judge = FakeJudge({"1_Scale": 2.0, "2_Softplus": 4.0, "3_RowSum": 1.0},
                      {"1_Scale": fake_ok(3.0), "2_Softplus": fake_ok(5.0),
                       "3_RowSum": Verdict(status="incorrect", trials=2, phase="check")},
                      ).install(monkeypatch)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py", "task_3.py")
    out = tmp_path / "run"
    cfg = audit_config(build_cache, ["eager", "compile:default"])

    def stop_after_the_first(kind: str, **data: Any) -> None:
        if kind == "task_done":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        audit(folder, TASKS, cfg, out=out, ids=[1, 2, 3], on_event=stop_after_the_first)
    assert (len(judge.modes), len(judge.configs)) == (1, 1)  # the first task only

    result = resume_audit(out)
    assert (len(judge.modes), len(judge.configs)) == (3, 3)  # the other two, once each
    t = by_task(result)
    assert [x.task for x in result.tasks] == ["1_Scale", "2_Softplus", "3_RowSum"]
    assert [x.status for x in result.tasks] == ["ok", "ok", "incorrect"]
    assert t["1_Scale"].compile_speedups == {"compile:default": pytest.approx(1.5)}
    assert result.aggregates.geomean_all == pytest.approx((3.0 * 5.0 * 1.0) ** (1 / 3))
    assert any(w.startswith("resumed") for w in result.warnings)
    assert not any(w.startswith("partial") for w in result.warnings)
    with RunStore.open(out) as store:  # one candidate per file, each judged once
        assert len(store.candidates()) == 3

    # a finished audit resumed again judges nothing; the CLI says what it needs
    assert resume_audit(out).aggregates.geomean_all == result.aggregates.geomean_all
    assert len(judge.configs) == 3
    cli = pike("audit", "--resume", out, "--json")
    assert cli.exit_code == 0, cli.output
    assert len(judge.configs) == 3
    refused = pike("audit", folder, "--resume", out)
    assert refused.exit_code == 2 and "drop SOLUTIONS" in refused.output
    missing = pike("audit", "--resume", tmp_path / "nothing")
    assert missing.exit_code == 2 and "no pike run" in missing.output
    assert pike("audit", folder).exit_code == 2


def test_a_mode_that_failed_before_a_call_was_cut_is_not_built_again_on_resume(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 call of 600 s was cut in 6_hunyuanvideo_vae_encoder's baselines after its
    compile:default ran 300 s to its build limit: the resume began them again. The failed
    mode is kept as it fails (not one out of GPU memory), and `--redo` forgets it."""
    from pike.audit import resume_audit
    from pike.evaluate.baseline import BaselineStopped

    asked: list[dict[str, Any]] = []
    calls = {"n": 0}

    def measure(task: Task, cfg: RunConfig, modes: list[str], on_event: Any = None,
                failed_before: Any = None, **_: Any) -> Baseline:
        asked.append(dict(failed_before or {}))
        calls["n"] += 1
        if calls["n"] == 1:  # the first call: two modes fail, then the driver's Ctrl-C
            on_event("mode_built", mode="compile:default", build_s=300.0,
                     error="no progress for 300 s in phase 'build'", again=False)
            on_event("mode_built", mode="compile:reduce-overhead", build_s=0.5,
                     error="torch.OutOfMemoryError: CUDA out of memory.", again=False)
            on_event("mode_built", mode="eager", build_s=0.1, error=None, again=False)
            raise BaselineStopped("stopped while its modes were measured")
        return fake_baseline(task, None)

    monkeypatch.setattr(audit_run, "measure_baselines", measure)
    monkeypatch.setattr(audit_run, "evaluate", lambda *a: fake_ok(2.0))
    folder = _files(tmp_path / "set", "task_1.py")
    out = tmp_path / "run"
    modes = ["eager", "compile:default", "compile:reduce-overhead"]
    first = audit(folder, TASKS, audit_config(build_cache, modes), out=out, ids=[1])
    assert first.tasks == [] and asked == [{}]
    from pike.search import failed_modes

    with RunStore.open(out) as store:  # in the same call it would be built again
        assert failed_modes.failed_modes(store, load_tasks(TASKS, [1])[0]) == {}
    monkeypatch.setattr(failed_modes, "_THIS_CALL", "a later call")  # a new device call
    resume_audit(out)
    kept = asked[1]
    assert list(kept) == ["compile:default"]  # the one out of memory is tried again
    assert kept["compile:default"].build_s == 300.0
    assert "no progress for 300 s" in kept["compile:default"].error
    assert "earlier call of this run" in kept["compile:default"].error
    resume_audit(out, redo=[1])  # a redo measures the task from the start
    assert asked[2] == {}


def test_a_resumed_audit_redoes_the_tasks_asked_and_fills_failed_baselines(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--redo IDS audits those tasks again from the start; --fill-baselines audits again
    the finished tasks whose baselines failed in a mode (a compile timed out), baselines
    and file together, as a task's figures come from one call; the rest is kept."""
    from pike.audit import resume_audit
    from tests.test_optimize import pike

    judge = FakeJudge({"1_Scale": 2.0, "2_Softplus": None, "3_RowSum": 1.0},
                      {"1_Scale": fake_ok(3.0), "2_Softplus": fake_ok(5.0),
                       "3_RowSum": fake_ok(1.5)}).install(monkeypatch)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py", "task_3.py")
    out = tmp_path / "run"
    cfg = audit_config(build_cache, ["eager", "compile:default"])
    first = audit(folder, TASKS, cfg, out=out, ids=[1, 2, 3])
    assert by_task(first)["2_Softplus"].compile_speedups == {}  # its mode failed
    assert len(judge.configs) == 3

    def ids_by_task() -> dict[str, list[int]]:
        with RunStore.open(out) as store:
            return {t: [r.id for r in store.candidates(t)]
                    for t in ("1_Scale", "2_Softplus", "3_RowSum")}

    before = ids_by_task()
    judge.verdicts["3_RowSum"] = fake_ok(2.5)  # judged again, it now says so
    events: list[tuple[str, str]] = []
    again = resume_audit(out, redo=[3], on_event=lambda kind, **d: events.append(
        (d["task"], d.get("phase", ""))))
    assert len(judge.configs) == 4 and ("3_RowSum", "redo") in events
    after = ids_by_task()
    assert after["1_Scale"] == before["1_Scale"] and after["3_RowSum"] != before["3_RowSum"]
    assert by_task(again)["3_RowSum"].speedup == pytest.approx(2.5)
    assert [t.status for t in again.tasks] == ["ok", "ok", "ok"]

    judge.compile_speedups["2_Softplus"] = 4.0  # the compile builds this time
    filled = resume_audit(out, fill_baselines=True)
    assert len(judge.configs) == 5  # 2_Softplus only: the others' baselines have no gap
    assert by_task(filled)["2_Softplus"].compile_speedups == {
        "compile:default": pytest.approx(5.0 / 4.0)}
    assert ids_by_task()["1_Scale"] == before["1_Scale"]
    assert resume_audit(out, fill_baselines=True) and len(judge.configs) == 5  # no gap left

    with pytest.raises(ConfigError, match="no such task in this audit"):
        resume_audit(out, redo=[7])
    cli = pike("audit", "--resume", out, "--redo", "1", "--json")
    assert cli.exit_code == 0, cli.output
    assert len(judge.configs) == 6
    alone = pike("audit", folder, TASKS, "--redo", "1")
    assert alone.exit_code == 2 and "give --resume" in alone.output


@pytest.mark.parametrize("now_on, torch_then, kept", [
    ("GPU-same", torch.__version__, True), ("GPU-other", torch.__version__, False),
    ("", torch.__version__, False), ("GPU-same", "2.4.0", False)])
def test_a_resumed_audit_keeps_a_baseline_whose_file_was_not_judged_only_on_its_card(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch, now_on: str,
        torch_then: str, kept: bool) -> None:
    """Cut off between a task's baseline and its file's verdict (a device call's limit in the
    middle of a long task): the next call keeps the baseline, failed modes and all, where it
    runs on the very card that timed it, with the same torch. Elsewhere, or where it cannot
    tell which card it has, the task is measured again, baseline and file together: a
    task's figures come from one card."""
    from pike.audit import resume_audit

    judge = FakeJudge({"1_Scale": 2.0}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    measure = judge.measure

    def on_a_card(task: Task, cfg: RunConfig, modes: list[str], **kw: Any) -> Baseline:
        return measure(task, cfg, modes, **kw).model_copy(
            update={"device_id": "GPU-same", "torch_version": torch_then})

    monkeypatch.setattr(audit_run, "measure_baselines", on_a_card)
    asked: list[str] = []
    monkeypatch.setattr(audit_run, "probe", lambda device: asked.append(device) or now_on)
    folder = _files(tmp_path / "set", "task_1.py")
    out = tmp_path / "run"

    def stop_before_judging(kind: str, **data: Any) -> None:
        if kind == "task_phase" and data.get("phase") == "evaluate":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        audit(folder, TASKS, audit_config(build_cache, ["eager", "compile:default"]), out=out,
              ids=[1], on_event=stop_before_judging)
    assert (len(judge.modes), len(judge.configs)) == (1, 0)
    events: list[tuple[str, dict[str, Any]]] = []
    result = resume_audit(out, on_event=lambda kind, **data: events.append((kind, data)))
    assert asked == ["cpu"]  # the device this call measures the task on
    assert (len(judge.modes), len(judge.configs)) == ((1, 1) if kept else (2, 1))
    assert [t.status for t in result.tasks] == ["ok"]
    assert [k for k, _ in events if k in ("baseline_kept", "mode_built")] == (
        ["baseline_kept"] if kept else [])
    assert result.tasks[0].compile_speedups["compile:default"] == pytest.approx(1.5)


def test_a_resumed_audit_on_several_gpus_gives_a_task_the_card_that_timed_its_baseline(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The least busy GPU is the first on a tie; a task whose baseline waits for its file
    gets the GPU behind the card that timed it instead, and keeps the baseline."""
    from pike.audit import resume_audit

    judge = FakeJudge({"1_Scale": 2.0}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    measure = judge.measure
    monkeypatch.setattr(audit_run, "measure_baselines", lambda *a, **kw: measure(
        *a, **kw).model_copy(update={"device_id": "GPU-b", "torch_version": torch.__version__}))
    monkeypatch.setattr(audit_run, "probe", {"cuda:0": "GPU-a", "cuda:1": "GPU-b"}.get)
    monkeypatch.setattr(audit_run, "resolve_device", str)  # no CUDA here: the names alone
    cfg = audit_config(build_cache, ["eager", "compile:default"])
    cfg.eval.devices = ["cuda:0", "cuda:1"]
    out = tmp_path / "run"

    def stop_before_judging(kind: str, **data: Any) -> None:
        if kind == "task_phase" and data.get("phase") == "evaluate":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        audit(_files(tmp_path / "set", "task_1.py"), TASKS, cfg, out=out, ids=[1],
              on_event=stop_before_judging)
    result = resume_audit(out)
    assert len(judge.modes) == 1  # not measured again
    assert [c.eval.device for c in judge.configs] == ["cuda:1"]
    assert [t.status for t in result.tasks] == ["ok"]


def test_tasks_timed_on_two_cards_of_one_model_are_said_to_be(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed audit on a fresh machine measures its tasks left on another card of the
    same model (two H100s, each cuda:0): the warning tells them apart by their identity."""
    judge = FakeJudge({"1_Scale": 2.0, "3_RowSum": 2.0},
                      {"1_Scale": fake_ok(3.0), "3_RowSum": fake_ok(3.0)}).install(monkeypatch)
    measure = judge.measure
    card = {"1_Scale": "GPU-7d9db774-5be0", "3_RowSum": "GPU-87a65e63-1a42"}

    def on_its_card(task: Task, cfg: RunConfig, modes: list[str], **kw: Any) -> Baseline:
        return measure(task, cfg, modes, **kw).model_copy(update={
            "device_id": card[task.name], "device_name": "NVIDIA H100 80GB HBM3"})

    monkeypatch.setattr(audit_run, "measure_baselines", on_its_card)
    cfg = audit_config(build_cache, ["eager", "compile:default"])
    result = audit(_files(tmp_path / "set", "task_1.py", "task_3.py"), TASKS, cfg,
                   out=tmp_path / "run", ids=[1, 3])
    [said] = [w for w in result.warnings if "devices:" in w]
    assert "measured on 2 devices" in said
    assert "NVIDIA H100 80GB HBM3 (GPU-7d9db774)" in said
    assert "NVIDIA H100 80GB HBM3 (GPU-87a65e63)" in said
    # one card timing every task: nothing to say
    card["3_RowSum"] = card["1_Scale"]
    again = audit(_files(tmp_path / "set2", "task_1.py", "task_3.py"), TASKS, cfg,
                  out=tmp_path / "run2", ids=[1, 3])
    assert not [w for w in again.warnings if "devices:" in w]


def test_tasks_spread_over_gpus_each_measured_and_judged_on_one_alone(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--devices`: a task's baselines and file are timed on one GPU, never beside another
    task there, and every GPU is used; a resumed audit may be given other GPUs."""
    import threading
    import time

    from pike.audit import resume_audit

    names = ["1_Scale", "2_Softplus", "3_RowSum", "10_Square"]
    judge = FakeJudge(dict.fromkeys(names, 2.0), {n: fake_ok(3.0) for n in names})
    where: dict[str, set[str]] = {}
    running: dict[str, int] = {}
    overlaps: list[str] = []
    lock = threading.Lock()

    def on_card(task: Task, cfg: RunConfig) -> None:
        device = cfg.eval.device or ""
        with lock:
            where.setdefault(task.name, set()).add(device)
            running[device] = running.get(device, 0) + 1
            if running[device] > 1:
                overlaps.append(device)
        time.sleep(0.05)
        with lock:
            running[device] -= 1

    measure, evaluate = judge.measure, judge.evaluate

    both_started = threading.Barrier(2, timeout=10)
    first_two: list[str] = []

    def measured(task: Task, cfg: RunConfig, modes: list[str], **_: Any) -> Baseline:
        with lock:
            first = len(first_two) < 2
            if first:
                first_two.append(task.name)
        if first:  # the first two tasks hold both GPUs at once, however loaded the host
            both_started.wait()
        on_card(task, cfg)
        return measure(task, cfg, modes).model_copy(update={"device": cfg.eval.device})

    def judged(task: Task, source: str, cfg: RunConfig) -> Verdict:
        on_card(task, cfg)
        return evaluate(task, source, cfg)

    monkeypatch.setattr(audit_run, "measure_baselines", measured)
    monkeypatch.setattr(audit_run, "evaluate", judged)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py", "task_3.py", "task_10.py")
    cfg = audit_config(build_cache, ["eager", "compile:default"])
    cfg.eval.devices = ["cuda:0", "cuda:1"]
    out = tmp_path / "run"

    done: list[str] = []

    def stop_after_two(kind: str, **data: Any) -> None:
        if kind == "task_done":
            done.append(data["task"])
            if len(done) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        audit(folder, TASKS, cfg, out=out, ids=[1, 2, 3, 10], on_event=stop_after_two)
    assert not overlaps
    assert all(len(cards) == 1 for cards in where.values())  # a task's figures, one card
    assert set().union(*where.values()) == {"cuda:0", "cuda:1"}
    assert all(c.eval.devices == [] for c in judge.configs)

    partial = AuditResult.model_validate_json((out / "audit.json").read_text())
    assert any("tasks spread over 2 GPUs (cuda:0, cuda:1), one at a time on each" in w
               for w in partial.warnings)
    first_call = {n: set(cards) for n, cards in where.items()}
    result = resume_audit(out, devices=["cuda:2"])
    for name in names:
        if name in done:  # judged in the first call: kept, not measured again
            assert where[name] == first_call[name]
        else:  # the rest, and any cut off before its file's verdict, on the new GPU
            assert "cuda:2" in where[name]
            assert where[name] - first_call.get(name, set()) == {"cuda:2"}
    assert [t.status for t in result.tasks] == ["ok"] * 4
    assert result.device.startswith("cuda:0, cuda:1")
    assert not any("spread over" in w for w in result.warnings)  # the resumed call: one GPU

    # the command line checks the GPUs it is given before any work, resumed or not
    from tests.test_optimize import pike

    for args in (("audit", folder, TASKS, "--devices", "cuda:99,cuda:98"),
                 ("audit", "--resume", out, "--devices", "cuda:99")):
        refused = pike(*args)
        assert refused.exit_code == 2 and "cuda:99 asked for" in refused.output, args
    empty = pike("audit", "--resume", out, "--devices", ",")
    assert empty.exit_code == 2 and "names no device" in empty.output
    import torch

    if torch.cuda.device_count() < 2:  # the GPUs the run recorded are checked on resume
        refused = pike("audit", "--resume", out)
        assert refused.exit_code == 2 and "asked for" in refused.output


def test_a_file_whose_child_ctrl_c_killed_is_judged_on_resume_not_stored_as_crashed(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C reaches an evaluation's child and pike's threads at once: a verdict of the
    killed child ("crashed") is no verdict on the file, and a resumed audit judges it."""
    import importlib

    from pike.audit import resume_audit
    from pike.search import drain

    monkeypatch.setattr(importlib.import_module("pike.evaluate.baseline"), "_STOP_GRACE_S", 0.2)
    names = ["1_Scale", "2_Softplus"]
    judge = FakeJudge(dict.fromkeys(names, 2.0), {n: fake_ok(3.0) for n in names})
    judge.install(monkeypatch)
    honest = judge.evaluate
    killed = [True]

    def evaluate(task: Task, source: str, cfg: RunConfig) -> Verdict:
        if task.name == "2_Softplus" and killed[0]:
            killed[0] = False
            drain.halt(interrupted=True)  # as Ctrl-C would, a moment after the kill
            return Verdict(status="crashed", phase="check",
                           message="killed by signal SIGKILL during phase 'check'")
        return honest(task, source, cfg)

    monkeypatch.setattr(audit_run, "evaluate", evaluate)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py")
    out = tmp_path / "run"
    first = audit(folder, TASKS, audit_config(build_cache), out=out, ids=[1, 2])
    assert [t.task for t in first.tasks] == ["1_Scale"] and first.open_tasks == ["2_Softplus"]
    with RunStore.open(out) as store:
        assert all(r.verdict is None or r.verdict.ok for r in store.candidates())
    done = resume_audit(out)
    assert [t.status for t in done.tasks] == ["ok", "ok"]


def test_a_time_limit_starts_no_new_task_and_resume_goes_on(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--stop-after`: a device session ends at a known time; a task started after it
    would be cut off and measured again from scratch, so none starts."""
    import time

    from pike.audit import resume_audit
    from tests.test_optimize import pike

    names = ["1_Scale", "2_Softplus", "3_RowSum"]
    judge = FakeJudge(dict.fromkeys(names, 2.0), {n: fake_ok(3.0) for n in names})
    judge.install(monkeypatch)
    measure = judge.measure

    def slow(task: Task, cfg: RunConfig, modes: list[str], **_: Any) -> Baseline:
        time.sleep(0.3)
        return measure(task, cfg, modes)

    monkeypatch.setattr(audit_run, "measure_baselines", slow)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py", "task_3.py")
    out = tmp_path / "run"
    result = audit(folder, TASKS, audit_config(build_cache), out=out, ids=[1, 2, 3],
                   stop_after=0.1)
    assert [t.task for t in result.tasks] == ["1_Scale"]  # in flight at the limit: finished
    assert result.open_tasks == ["2_Softplus", "3_RowSum"]
    assert any(w.startswith("partial: 1 of 3") for w in result.warnings)
    assert len(judge.configs) == 1
    done = resume_audit(out)
    assert [t.status for t in done.tasks] == ["ok"] * 3 and done.open_tasks == []
    assert len(judge.configs) == 3  # the first task was not judged again

    cli = pike("audit", folder, TASKS, "--tasks", "1,2", "--stop-after", "0", "--json",
               "--config", _config_file(tmp_path, build_cache), "--out", tmp_path / "cli")
    assert cli.exit_code == 75, cli.output
    assert json.loads(cli.stdout)["open_tasks"] == ["1_Scale", "2_Softplus"]
    assert "pike audit --resume" in " ".join(cli.stderr.split())  # rich wraps lines


def _config_file(tmp_path: Path, build_cache: Path) -> Path:
    path = tmp_path / "audit.yaml"
    path.write_text(yaml.safe_dump(audit_config(build_cache).model_dump(mode="json")))
    return path


def test_audits_of_parts_of_a_set_combine_into_the_whole_sets_figures(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An audit spread over hosts or device sessions, task by task: gathered, the result is
    what one audit of every task gives, with nothing measured again."""
    from pike.audit import resume_audit
    from pike.audit.combine import combine
    from tests.test_optimize import pike

    FakeJudge({"1_Scale": 2.0, "2_Softplus": 4.0, "3_RowSum": None},
              {"1_Scale": fake_ok(3.0), "2_Softplus": fake_ok(5.0),
               "3_RowSum": Verdict(status="incorrect", trials=2, phase="check")},
              broken=("10_Square",)).install(monkeypatch)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py", "task_3.py", "task_10.py")
    cfg = audit_config(build_cache, ["eager", "compile:default"])
    whole = audit(folder, TASKS, cfg, out=tmp_path / "whole")
    audit(folder, TASKS, cfg, out=tmp_path / "a", ids=[1, 2])
    audit(folder, TASKS, cfg, out=tmp_path / "b", ids=[3, 10])
    monkeypatch.setattr(audit_run, "evaluate", None)  # combining judges nothing
    monkeypatch.setattr(audit_run, "measure_baselines", None)

    both = combine(folder, TASKS, [tmp_path / "a", tmp_path / "b"], out=tmp_path / "ab")
    assert [(t.task, t.status, t.speedup, t.compile_speedups) for t in both.tasks] == [
        (t.task, t.status, t.speedup, t.compile_speedups) for t in whole.tasks]
    assert both.aggregates.model_dump() == whole.aggregates.model_dump()
    assert both.open_tasks == [] and both.combined_from == [str(tmp_path / "a"),
                                                            str(tmp_path / "b")]
    page = (tmp_path / "ab" / "audit.md").read_text()
    assert "gathered from the audit runs" in page and "gathered from 2 audit runs" in page

    # one part alone: the tasks no run judged are open, and said so
    part = combine(folder, TASKS, [tmp_path / "a"], out=tmp_path / "only-a")
    assert part.open_tasks == ["3_RowSum", "10_Square"]
    assert [t.task for t in part.tasks] == ["1_Scale", "2_Softplus", "4_Negate"]  # 4: no file
    assert any(w.startswith("partial: 3 of 5") for w in part.warnings)
    # the part's own tasks only (an audit of a sample of a large folder): nothing open, and
    # the tasks of the folder outside the sample do not count as missing
    sample = combine(folder, TASKS, [tmp_path / "a"], out=tmp_path / "sample", ids=[1, 2])
    assert [t.task for t in sample.tasks] == ["1_Scale", "2_Softplus"]
    assert sample.open_tasks == [] and sample.aggregates.missing == 0
    assert sample.aggregates.geomean_all == pytest.approx(15 ** 0.5)

    # what would mix different things under one figure is refused
    with pytest.raises(ConfigError, match="judged in both .* or give --later-wins"):
        combine(folder, TASKS, [tmp_path / "whole", tmp_path / "a"], out=tmp_path / "x")
    cfg3 = audit_config(build_cache, ["eager", "compile:default"])
    cfg3.eval.trials = 3
    monkeypatch.undo()
    FakeJudge({"3_RowSum": 1.0}, {"3_RowSum": fake_ok(1.0)}).install(monkeypatch)
    audit(folder, TASKS, cfg3, out=tmp_path / "c", ids=[3])
    with pytest.raises(ConfigError, match=r"different terms \(trials\)"):
        combine(folder, TASKS, [tmp_path / "a", tmp_path / "c"], out=tmp_path / "x")
    # a run against eager alone (a task whose compile builds outlast a device call) beside
    # one of every mode: gathered, its task left out of the figures over a compile mode,
    # and said so; a run whose baselines leave eager out is refused
    FakeJudge({"1_Scale": 2.0}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    audit(folder, TASKS, audit_config(build_cache, ["eager"]), out=tmp_path / "h", ids=[1])
    eager_only = combine(folder, TASKS, [tmp_path / "b", tmp_path / "h"], out=tmp_path / "bh")
    alone_b = combine(folder, TASKS, [tmp_path / "b"], out=tmp_path / "only-b")
    assert by_task(eager_only)["1_Scale"].speedup == pytest.approx(3.0)
    assert by_task(eager_only)["1_Scale"].compile_speedups == {}
    assert eager_only.aggregates.modes == alone_b.aggregates.modes
    assert any(w.startswith("the runs timed different baselines (") and
               f"; eager in {tmp_path / 'h'})" in w for w in eager_only.warnings), eager_only.warnings
    FakeJudge({"1_Scale": 2.0}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    audit(folder, TASKS, audit_config(build_cache, ["compile:default"]), out=tmp_path / "k",
          ids=[1])
    with pytest.raises(ConfigError, match="without eager"):
        combine(folder, TASKS, [tmp_path / "b", tmp_path / "k"], out=tmp_path / "x")
    # a task whose reference failed in one run and was judged in another: the judgment
    FakeJudge({"10_Square": 1.0}, {"10_Square": fake_ok(2.0)}).install(monkeypatch)
    audit(folder, TASKS, cfg, out=tmp_path / "d", ids=[10])
    same = combine(folder, TASKS, [tmp_path / "a", tmp_path / "d"], out=tmp_path / "ad")
    assert not any("different limits" in w for w in same.warnings)
    # a longer build limit may let a mode build that failed elsewhere: said, not refused
    patient = cfg.model_copy(deep=True)
    patient.eval.limits.build_seconds = 1200
    audit(folder, TASKS, patient, out=tmp_path / "f", ids=[10])
    mixed = combine(folder, TASKS, [tmp_path / "a", tmp_path / "f"], out=tmp_path / "af")
    assert any(f"{tmp_path / 'a'}: 300 s, {tmp_path / 'f'}: 1200 s" in w
               for w in mixed.warnings), mixed.warnings
    fixed = combine(folder, TASKS, [tmp_path / "a", tmp_path / "b", tmp_path / "d"],
                    out=tmp_path / "abd")
    assert by_task(fixed)["10_Square"].status == "ok"
    assert any(w.startswith("10_Square: an error in") and "kept from there" in w
               for w in fixed.warnings)
    # a task judged again in a later run (its first verdict the evaluator's fault): taken
    # from the run named later where asked, and said so
    FakeJudge({"1_Scale": 2.0}, {"1_Scale": fake_ok(6.0)}).install(monkeypatch)
    audit(folder, TASKS, cfg, out=tmp_path / "g", ids=[1])
    first, again = by_task(part)["1_Scale"].speedup, by_task(combine(
        folder, TASKS, [tmp_path / "g"], out=tmp_path / "only-g"))["1_Scale"].speedup
    assert first != again
    for order, kept in (([tmp_path / "a", tmp_path / "g"], again),
                        ([tmp_path / "g", tmp_path / "a"], first)):
        later = combine(folder, TASKS, order, out=tmp_path / "later", later_wins=True)
        assert by_task(later)["1_Scale"].speedup == kept
        assert by_task(later)["2_Softplus"].speedup == by_task(part)["2_Softplus"].speedup
        assert any(w.startswith(f"1_Scale: judged in {order[0]} (ok) and again in "
                                f"{order[1]} (ok): the later kept") for w in later.warnings)
    # a run made on another version of a task file
    other_tasks = tmp_path / "other-tasks"
    other_tasks.mkdir()
    for task_file in TASKS.iterdir():
        (other_tasks / task_file.name).write_text(task_file.read_text())
    (other_tasks / "1_Scale.py").write_text((TASKS / "1_Scale.py").read_text() + "\n# edited\n")
    FakeJudge({"1_Scale": 2.0}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    audit(folder, other_tasks, cfg, out=tmp_path / "e", ids=[1])
    with pytest.raises(ConfigError, match="another version of 1_Scale"):
        combine(folder, TASKS, [tmp_path / "e"], out=tmp_path / "x")
    with pytest.raises(ConfigError, match="named more than once"):
        combine(folder, TASKS, [tmp_path / "a", tmp_path / "a"], out=tmp_path / "x")
    (folder / "task_1.py").write_text("# another solution\n")
    with pytest.raises(ConfigError, match="another file for 1_Scale"):
        combine(folder, TASKS, [tmp_path / "a"], out=tmp_path / "x")
    # the set's file for one task replaced and that task audited anew: a run named later
    # that judged the set's file passes over the earlier runs' judgment of the old one
    FakeJudge({"1_Scale": 2.0}, {"1_Scale": fake_ok(9.0)}).install(monkeypatch)
    audit(folder, TASKS, cfg, out=tmp_path / "n", ids=[1])
    renewed = combine(folder, TASKS, [tmp_path / "a", tmp_path / "n"], out=tmp_path / "an",
                      later_wins=True)
    assert by_task(renewed)["1_Scale"].speedup == pytest.approx(9.0)
    assert by_task(renewed)["2_Softplus"].speedup == by_task(part)["2_Softplus"].speedup
    assert f"1_Scale: {tmp_path / 'a'} judged another file than the set's; the set's file " \
        f"judged in {tmp_path / 'n'} kept (--later-wins)" in renewed.warnings
    with pytest.raises(ConfigError, match="no run named after it judged the set's file"):
        combine(folder, TASKS, [tmp_path / "n", tmp_path / "a"], out=tmp_path / "x",
                later_wins=True)
    with pytest.raises(ConfigError, match="another file for 1_Scale"):
        combine(folder, TASKS, [tmp_path / "a", tmp_path / "n"], out=tmp_path / "x")
    (folder / "task_1.py").write_text("# a solution\n")

    # the CLI: one result folder of its own, and nothing that would measure
    cli = pike("audit", folder, TASKS, "--combine", tmp_path / "a", "--combine", tmp_path / "b",
               "--out", tmp_path / "cli", "--json")
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["aggregates"] == whole.aggregates.model_dump(mode="json")
    over = pike("audit", folder, TASKS, "--combine", tmp_path / "a", "--out", tmp_path / "a")
    assert over.exit_code == 2 and "holds a run store" in over.output
    alone = pike("audit", folder, TASKS, "--later-wins", "--out", tmp_path / "w")
    assert alone.exit_code == 2 and "runs gathered with --combine" in alone.output
    cli_later = pike("audit", folder, TASKS, "--combine", tmp_path / "a", "--combine",
                     tmp_path / "g", "--later-wins", "--out", tmp_path / "cli-later", "--json")
    assert cli_later.exit_code == 0, cli_later.output
    assert [t["speedup"] for t in json.loads(cli_later.stdout)["tasks"]
            if t["task"] == "1_Scale"] == [again]
    measuring = pike("audit", folder, TASKS, "--combine", tmp_path / "a", "--out",
                     tmp_path / "y", "--devices", "cuda:0")
    assert measuring.exit_code == 2 and "drop --devices" in measuring.output
    sampled = pike("audit", folder, TASKS, "--combine", tmp_path / "a", "--tasks", "1,2",
                   "--out", tmp_path / "z", "--json")
    assert sampled.exit_code == 0, sampled.output
    assert [t["task"] for t in json.loads(sampled.stdout)["tasks"]] == ["1_Scale", "2_Softplus"]
    # a redo cut off before the task was judged again: the earlier verdict stands, said so
    resume_audit(tmp_path / "g", redo=[1], stop_after=0)
    cut = combine(folder, TASKS, [tmp_path / "a", tmp_path / "g"], out=tmp_path / "later",
                  later_wins=True)
    assert by_task(cut)["1_Scale"].speedup == first
    assert f"1_Scale: not finished in {tmp_path / 'g'}, named after {tmp_path / 'a'}: the " \
        "verdict there kept" in cut.warnings


def test_an_auto_run_combines_with_fixed_runs_only_where_it_built_its_tasks_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build_cache: Path) -> None:
    """construct_on auto settles where each task's models are built: gathered beside runs
    that built every task on the CPU, it is one audit's terms where its tasks were built on
    the CPU too, and refused (the task named) where one was built on the GPU; runs of cpu
    and of device never gather. The verdict records where, the audit keeps it, and its
    protocol line says it."""
    from pike.audit.combine import combine

    def judged(where: str) -> Verdict:
        return fake_ok(2.0).model_copy(update={"built_on": where})

    folder = _files(tmp_path / "set", "task_1.py", "task_2.py", "task_3.py", "task_10.py")

    def run(name: str, construct_on: str, ids: list[int], where: str) -> None:
        cfg = audit_config(build_cache)
        cfg.eval.construct_on = construct_on  # type: ignore[assignment]
        FakeJudge({}, {t: judged(where) for t in ("1_Scale", "2_Softplus", "3_RowSum",
                                                  "10_Square")}).install(monkeypatch)
        audit(folder, TASKS, cfg, out=tmp_path / name, ids=ids)

    run("cpu", "cpu", [1, 2], "cpu")
    run("auto-cpu", "auto", [3, 10], "cpu")
    run("auto-gpu", "auto", [3, 10], "device")
    run("gpu", "device", [3, 10], "device")
    monkeypatch.setattr(audit_run, "evaluate", None)  # combining judges nothing
    monkeypatch.setattr(audit_run, "measure_baselines", None)

    both = combine(folder, TASKS, [tmp_path / "cpu", tmp_path / "auto-cpu"], out=tmp_path / "a")
    assert {t.task: t.built_on for t in both.tasks if t.file} == dict.fromkeys(
        ["1_Scale", "2_Softplus", "3_RowSum", "10_Square"], "cpu")
    assert both.protocol.endswith("models built on the CPU")
    assert not any("built on the GPU" in w for w in both.warnings)
    with pytest.raises(ConfigError, match=r"built these tasks elsewhere.*3_RowSum \(device"):
        combine(folder, TASKS, [tmp_path / "cpu", tmp_path / "auto-gpu"], out=tmp_path / "b")
    with pytest.raises(ConfigError, match="different terms \\(construct_on"):
        combine(folder, TASKS, [tmp_path / "cpu", tmp_path / "gpu"], out=tmp_path / "c")
    # an auto run alone says so; where its tasks were built apart, the result names those
    # built on the GPU
    alone = combine(folder, TASKS, [tmp_path / "auto-gpu"], out=tmp_path / "d")
    assert alone.protocol.endswith("reach 256 MiB, else on the CPU")
    mixed = audit_run._built_apart([t.model_copy(update={"built_on": w}) for t, w in
                                    zip(both.tasks[:2], ["cpu", "device"], strict=True)])
    assert mixed == [f"models built on the GPU for 1 of 2 tasks ({both.tasks[1].task}), "
                     "on the CPU for the others"]


def test_bars_never_compared_with_eager_are_named() -> None:
    """A compile mode that was only timed may be wrong for its task (48_Mamba2's was):
    the result names the tasks measured against such a bar, and why one was unchecked."""
    tasks = load_tasks(TASKS, [1, 2, 3])
    base = [fake_baseline(tasks[0], 2.0), fake_baseline(tasks[1], 2.0, checked=None),
            fake_baseline(tasks[2], 2.0, checked=False)]
    base[2].modes[1].check_note = "eager answers trial 0 otherwise when called again"
    audits = [audit_run.TaskAudit(task=t.name, status="ok") for t in tasks]
    lines = audit_run._unchecked_bars(audits, {b.task: b for b in base})
    assert lines == [
        "compile modes timed but never compared with eager (baselines measured before pike "
        "checked them; one may be wrong for its task): 2_Softplus",
        "compile modes that could not be compared with eager: 3_RowSum compile:default "
        "(eager answers trial 0 otherwise when called again)"]
    assert audit_run._unchecked_bars(audits[:1], {b.task: b for b in base}) == []


def test_a_task_whose_check_tells_little_is_named_in_the_warnings(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Level 2's 9_Matmul_Subtract_Multiply_ReLU gives 0 everywhere on its own inputs: a
    figure judged on it says so where the audit's reader looks."""
    weak = fake_ok(3.0)
    weak.weak_check = "the reference gave the same outputs for all 6 trials on the task's own inputs"
    FakeJudge({"1_Scale": 2.0, "2_Softplus": 2.0},
              {"1_Scale": weak, "2_Softplus": fake_ok(2.0)}).install(monkeypatch)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py")
    result = audit(folder, TASKS, audit_config(build_cache, ["eager", "compile:default"]),
                   out=tmp_path / "run", ids=[1, 2])
    assert by_task(result)["1_Scale"].weak_check == weak.weak_check
    assert by_task(result)["2_Softplus"].weak_check == ""
    assert f"1_Scale: {weak.weak_check}" in result.warnings
    assert not any(w.startswith("2_Softplus:") for w in result.warnings)
    assert weak.weak_check in to_markdown(result)


def test_a_correct_file_whose_figure_was_withheld_says_why(
        tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A noisy window gives a correct file no figure, and the task counts 1.0x: the audit
    says so and why, where before the figure was simply missing."""
    noisy = Verdict(status="ok", trials=2, trials_passed=2, noisy=True, noisy_speedup=2.5,
                    noisy_why="the reference's calls were not steady")
    FakeJudge({"1_Scale": 2.0, "2_Softplus": 2.0},
              {"1_Scale": noisy, "2_Softplus": fake_ok(2.0)}).install(monkeypatch)
    folder = _files(tmp_path / "set", "task_1.py", "task_2.py")
    result = audit(folder, TASKS, audit_config(build_cache, ["eager", "compile:default"]),
                   out=tmp_path / "run", ids=[1, 2])
    t = by_task(result)
    assert t["1_Scale"].withheld == "the reference's calls were not steady, 2.5x in that window"
    assert t["1_Scale"].counted_speedup() == 1.0 and t["2_Softplus"].withheld == ""
    assert any(w.startswith("1_Scale: correct, but its figure was withheld") for w in
               result.warnings)
