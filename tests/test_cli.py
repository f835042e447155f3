"""The `pike` command line as a user runs it: exit codes, tables, JSON, one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pike.cli import app
from tests.conftest import BUILT_UNDER_A_DEVICE, CANDIDATES, EXAMPLES

MLP = str(EXAMPLES / "tasks" / "1_GeluMLP.py")
FUSED = str(CANDIDATES / "fused.py")

TASK = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''
BROKEN_FORWARD = TASK.replace("return torch.relu(x) * 2",
                              'raise RuntimeError("forward is broken [on purpose]")')

@pytest.fixture
def config(tmp_path: Path, build_cache: Path) -> Path:
    """A fast CPU protocol; runs_dir inside tmp_path."""
    path = tmp_path / "pike.yaml"
    path.write_text(yaml.safe_dump({
        "runs_dir": str(tmp_path / "runs"),
        "eval": {
            "device": "cpu", "trials": 2, "build_cache": str(build_cache),
            "timing": {"warmup_calls": 1, "warmup_seconds": 0.0, "min_calls": 5,
                       "min_seconds": 0.02},
            "limits": {"load_seconds": 120, "check_seconds": 30, "timing_seconds": 60,
                       "memory_gib": 2},
        },
    }))
    return path


def pike(*args: str | Path) -> Any:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a crash, not an exit code: show it as it is
    return result


def assert_user_error(result: Any, *words: str) -> None:
    """Exit 2, one line on stderr naming the problem, no traceback, nothing on stdout."""
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert "\n" not in err, err
    assert err.startswith("error: "), err
    for word in words:
        assert word in err, err
    assert result.stdout == ""


# ---- pike eval -----------------------------------------------------------------------------


# an `ok` verdict rests on this host's timing (the wall-clock guard): run alone
@pytest.mark.timing
def test_eval_prints_a_table_with_status_and_speedup(config: Path) -> None:
    result = pike("eval", MLP, FUSED, "--device", "cpu", "--config", config)
    assert result.exit_code == 0, result.output
    assert "fused.py vs 1_GeluMLP" in result.stdout
    assert re.search(r"status\s+│ ok ", result.stdout), result.stdout
    assert re.search(r"trials passed\s+│ 2 of 2 ", result.stdout), result.stdout
    assert re.search(r"speedup\s+│ \d+\.\d\dx ", result.stdout), result.stdout
    assert re.search(r"reference \(eager\)\s+│ [\d.]+ ms median", result.stdout)


# an `ok` verdict rests on this host's timing (the wall-clock guard): run alone
@pytest.mark.timing
def test_eval_json_and_folder_id(config: Path) -> None:
    result = pike("eval", EXAMPLES / "tasks" / "1", FUSED, "--device", "cpu", "--json",
                  "--config", config)
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert verdict["status"] == "ok"
    assert verdict["device"] == "cpu"
    assert verdict["trials_passed"] == verdict["trials"] == 2
    assert verdict["speedup"] == pytest.approx(
        verdict["reference"]["median_ms"] / verdict["runtime"]["median_ms"])


def test_eval_flags_override_the_config(config: Path) -> None:
    result = pike("eval", MLP, FUSED, "--device", "cpu", "--json", "--no-timing",
                  "--trials", "3", "--config", config)
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert (verdict["status"], verdict["trials"]) == ("ok", 3)
    assert verdict["runtime"] is None and verdict["speedup"] is None


def test_eval_wrong_candidate_exits_1(config: Path) -> None:
    result = pike("eval", MLP, CANDIDATES / "wrong_values.py", "--device", "cpu",
                  "--config", config)
    assert result.exit_code == 1, result.output
    assert re.search(r"status\s+│ incorrect \(phase check\)", result.stdout), result.stdout
    assert "values outside atol=0.01" in result.stdout
    assert "speedup" not in result.stdout
    as_json = pike("eval", MLP, CANDIDATES / "wrong_values.py", "--device", "cpu", "--json",
                   "--config", config)
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["status"] == "incorrect"


def test_construct_on_device_builds_under_the_device(tmp_path: Path, config: Path) -> None:
    task = tmp_path / "1_BuiltOnDevice.py"
    task.write_text(BUILT_UNDER_A_DEVICE)
    candidate = tmp_path / "cand.py"
    candidate.write_text(BUILT_UNDER_A_DEVICE.replace("class Model(", "class ModelNew("))
    built = pike("eval", task, candidate, "--device", "cpu", "--construct-on", "device",
                 "--no-timing", "--json", "--config", config)
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["status"] == "ok"
    assert_user_error(pike("eval", task, candidate, "--device", "cpu", "--no-timing",
                           "--config", config), "not built under torch.device")
    assert_user_error(pike("baseline", task, "--construct-on", "gpu", "--config", config),
                      "--construct-on 'gpu'", "use auto or cpu or device")


# ---- user errors: exit 2, one line, no traceback -------------------------------------------


def test_missing_task_file(tmp_path: Path, config: Path) -> None:
    missing = tmp_path / "9_Missing.py"
    assert_user_error(pike("eval", missing, FUSED, "--config", config),
                      str(missing), "no such task file")


def test_missing_task_id(config: Path) -> None:
    assert_user_error(pike("eval", EXAMPLES / "tasks" / "9", FUSED, "--config", config),
                      str(EXAMPLES / "tasks"), "no task file with id 9")


@pytest.mark.parametrize(("old", "new", "words"), [
    ("def get_inputs(", "def inputs(", "defines no `get_inputs()` function"),
    ("def forward(self, x):", "def forward(self, x)", ":6: syntax error"),
    ("class Model(", "class Net(", "defines no `Model` class"),
], ids=["no_get_inputs", "syntax_error", "no_model"])
def test_malformed_task(tmp_path: Path, config: Path, old: str, new: str, words: str) -> None:
    task = tmp_path / "1_Bad.py"
    task.write_text(TASK.replace(old, new))
    assert_user_error(pike("eval", task, FUSED, "--config", config), str(task), words)


def test_task_that_fails_when_run(tmp_path: Path, config: Path) -> None:
    task = tmp_path / "1_NotAList.py"
    task.write_text(TASK.replace("return [torch.randn(8, 8)]", "return torch.randn(8, 8)"))
    assert_user_error(pike("eval", task, FUSED, "--no-timing", "--config", config),
                      str(task), "get_inputs() must return a list or tuple")


def test_missing_candidate(tmp_path: Path, config: Path) -> None:
    missing = tmp_path / "nope.py"
    assert_user_error(pike("eval", MLP, missing, "--config", config),
                      str(missing), "cannot read candidate")


BAD_CONFIGS = [
    # id, file content (None: no file), words
    ("missing", None, "config file not found"),
    ("not_yaml", "eval: [unclosed", "not valid YAML"),
    ("unknown_key", "eval:\n  trails: 3\n", "eval.trails: Extra inputs are not permitted"),
    ("wrong_type", "eval:\n  trials: many\n", "eval.trials: Input should be a valid integer"),
    ("out_of_range", "eval:\n  trials: 0\n", "eval.trials: Input should be greater than"),
    ("folder", "", "cannot read config file"),
]


@pytest.mark.parametrize(("name", "content", "words"), BAD_CONFIGS,
                         ids=[c.values[0] if hasattr(c, "values") else c[0]
                              for c in BAD_CONFIGS])
def test_bad_config_file(tmp_path: Path, name: str, content: str | None, words: str) -> None:
    path = tmp_path / f"{name}.yaml"
    if name == "folder":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    for command in (["eval", MLP, FUSED], ["baseline", MLP]):
        assert_user_error(pike(*command, "--config", path), str(path), words)


def test_bad_options(tmp_path: Path, config: Path) -> None:
    assert_user_error(pike("baseline", EXAMPLES / "tasks", "--tasks", "1,x", "--config", config),
                      "--tasks '1,x'", "numeric task ids")
    assert_user_error(pike("baseline", MLP, "--modes", "fast", "--config", config),
                      "unknown mode 'fast'")
    assert_user_error(pike("baseline", MLP, "--modes", ",", "--config", config), "no mode given")
    assert pike("eval", MLP, FUSED, "--trials", "0").exit_code == 2  # typer's usage error


def test_error_text_is_printed_literally(tmp_path: Path, config: Path) -> None:
    """Brackets in a message are not rich markup: `[/x]` neither vanishes nor crashes."""
    folder = tmp_path / "tasks [/x] [bold]"
    folder.mkdir(parents=True)
    assert_user_error(pike("eval", folder / "4", FUSED, "--config", config),
                      f"{folder}: no task file with id 4")


def test_long_error_stays_on_one_line(tmp_path: Path, config: Path) -> None:
    deep = tmp_path / ("long-folder-name-" * 6) / ("another-long-name-" * 4) / "1_Task.py"
    assert_user_error(pike("eval", deep, FUSED, "--config", config), str(deep))


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    """The real entry point, in a process of its own, as a user types it."""
    missing = tmp_path / "1_Missing.py"
    proc = subprocess.run([sys.executable, "-m", "pike.cli", "eval", str(missing), FUSED],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: {missing}: no such task file"
    assert proc.stdout == ""


# ---- pike baseline -------------------------------------------------------------------------


def task_folder(root: Path, **files: str) -> Path:
    folder = root / "tasks"
    folder.mkdir()
    for name, source in files.items():
        (folder / f"{name}.py").write_text(source)
    return folder


def test_baseline_writes_json_under_runs_dir(tmp_path: Path, config: Path) -> None:
    folder = task_folder(tmp_path, **{"1_Double": TASK})
    result = pike("baseline", folder, "--modes", "eager", "--config", config)
    assert result.exit_code == 0, result.output
    assert re.search(r"1_Double\s+│\s+[\d.]+ ms", result.stdout), result.stdout
    written = tmp_path / "runs" / "baselines" / "1_Double.json"
    assert f"wrote 1 baseline file(s) to {written.parent}" in result.stderr
    data = json.loads(written.read_text())
    assert data["task"] == "1_Double" and data["device"] == "cpu"
    assert [m["mode"] for m in data["modes"]] == ["eager"]
    assert data["modes"][0]["stats"]["median_ms"] > 0


def test_baseline_continues_past_a_failing_task(tmp_path: Path, config: Path) -> None:
    folder = task_folder(tmp_path, **{"1_Double": TASK, "2_Broken": BROKEN_FORWARD,
                                      "3_Triple": TASK.replace("* 2", "* 3")})
    out = tmp_path / "out"
    result = pike("baseline", folder, "--modes", "eager", "--out", out, "--json",
                  "--config", config)
    assert result.exit_code == 0, result.output
    assert re.search(r"2_Broken: .*2_Broken\.py: reference failed in phase 'check': "
                     r"RuntimeError: forward is broken \[on purpose\]", result.stderr)
    report = json.loads(result.stdout)
    assert [b["task"] for b in report["baselines"]] == ["1_Double", "3_Triple"]
    assert list(report["failures"]) == ["2_Broken"]
    assert "forward is broken [on purpose]" in report["failures"]["2_Broken"]
    assert sorted(p.name for p in out.iterdir()) == ["1_Double.json", "3_Triple.json"]
    assert json.loads((out / "3_Triple.json").read_text())["task"] == "3_Triple"
    assert not (tmp_path / "runs").exists()  # --out wins over the config's runs_dir


def test_baseline_of_only_failing_tasks_exits_2(tmp_path: Path, config: Path) -> None:
    folder = task_folder(tmp_path, **{"1_Broken": BROKEN_FORWARD})
    result = pike("baseline", folder, "--modes", "eager", "--config", config)
    assert result.exit_code == 2, result.output
    assert "forward is broken [on purpose]" in result.stderr


def test_baseline_of_some_ids(tmp_path: Path, config: Path) -> None:
    folder = task_folder(tmp_path, **{"1_Double": TASK, "2_Broken": BROKEN_FORWARD})
    out = tmp_path / "out"
    result = pike("baseline", folder, "--tasks", "1", "--modes", "eager", "--out", out,
                  "--json", "--config", config)
    assert result.exit_code == 0, result.output
    assert [b["task"] for b in json.loads(result.stdout)["baselines"]] == ["1_Double"]
    assert [p.name for p in out.iterdir()] == ["1_Double.json"]


@pytest.mark.slow
def test_baseline_with_a_compile_mode(tmp_path: Path, config: Path) -> None:
    """torch.compile on CPU builds C++ with inductor: about 25 s."""
    out = tmp_path / "out"
    task = task_folder(tmp_path, **{"1_Double": TASK}) / "1_Double.py"
    result = pike("baseline", task, "--modes", "eager,compile:no-such-mode,compile:default",
                  "--out", out, "--json", "--config", config)
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout)["baselines"][0]["modes"]
    assert [m["mode"] for m in modes] == ["eager", "compile:no-such-mode", "compile:default"]
    eager, bogus, compiled = modes
    assert compiled["stats"]["median_ms"] > 0, compiled["error"]
    # each mode's build is reported as it ends: a large model's takes minutes
    said = " ".join(result.stderr.split())
    assert re.search(r"1_Double: baseline compile:default built in \d+\.\d s", said), said
    assert "1_Double: baseline compile:no-such-mode failed in" in said
    assert "1_Double: baseline eager built in" in said
    assert compiled["speedup_vs_eager"] == pytest.approx(
        eager["stats"]["median_ms"] / compiled["stats"]["median_ms"])
    # each mode is built and warmed up before the timed window: the compile is its build
    assert compiled["build_s"] > 1.0 > eager["build_s"]
    assert bogus["stats"] is None and "no-such-mode" in bogus["error"]
    assert compiled["checked"] is True and eager["checked"] is None  # it answers as eager


def _prebuild_on(config: Path) -> None:
    """eval.prebuild_autotune on: `auto` leaves it off for `pike baseline`, one task at a
    time."""
    cfg = yaml.safe_load(config.read_text())
    cfg["eval"]["prebuild_autotune"] = "on"
    config.write_text(yaml.safe_dump(cfg))


def _autotuned_baseline(tmp_path: Path, config: Path, name: str,
                        source: str) -> tuple[dict, dict, str]:
    """`pike baseline` of one task in eager and max-autotune, its pre-build on: the two
    modes' rows and what it said on stderr."""
    _prebuild_on(config)
    task = task_folder(tmp_path, **{name: source}) / f"{name}.py"
    result = pike("baseline", task, "--modes", "eager,compile:max-autotune-no-cudagraphs",
                  "--out", tmp_path / "out", "--json", "--config", config)
    assert result.exit_code == 0, result.output
    eager, tuned = json.loads(result.stdout)["baselines"][0]["modes"]
    return eager, tuned, " ".join(result.stderr.split())


@pytest.mark.slow
def test_an_autotuning_baseline_mode_is_built_first_beside_others(tmp_path: Path,
                                                                   config: Path) -> None:
    """max-autotune compiles once beside other evaluations, then again with the device
    held alone (baseline._prebuild): the build's line says how much of it held the device."""
    eager, tuned, said = _autotuned_baseline(tmp_path, config, "1_Double", TASK)
    assert tuned["stats"]["median_ms"] > 0 and tuned["checked"] is True, tuned
    assert 0 < tuned["prebuild_s"] < tuned["build_s"] and eager["prebuild_s"] is None
    line = re.search(r"1_Double: baseline compile:max-autotune-no-cudagraphs built in "
                     r"(\d+\.\d) s \((\d+\.\d) s of it with the device alone\)", said)
    assert line, said
    assert float(line[1]) == pytest.approx(tuned["build_s"], abs=0.06)
    assert float(line[2]) == pytest.approx(tuned["build_s"] - tuned["prebuild_s"], abs=0.06)


@pytest.mark.slow
def test_a_compile_mode_whose_outputs_are_wrong_is_no_baseline(tmp_path: Path,
                                                              config: Path) -> None:
    """A compiled mode that answers otherwise than eager on the check trials (48_Mamba2's
    did, past the tolerance) is reported incorrect, not timed as the bar for a candidate."""
    wrong = TASK.replace(
        "        return torch.relu(x) * 2",
        "        if torch.compiler.is_compiling():\n            return torch.relu(x) * 3\n"
        "        return torch.relu(x) * 2")
    out = tmp_path / "out"
    task = task_folder(tmp_path, **{"1_Wrong": wrong}) / "1_Wrong.py"
    result = pike("baseline", task, "--modes", "eager,compile:default", "--out", out,
                  "--json", "--config", config)
    assert result.exit_code == 0, result.output
    eager, compiled = json.loads(result.stdout)["baselines"][0]["modes"]
    assert eager["stats"]["median_ms"] > 0
    assert compiled["stats"] is None
    assert compiled["error"].startswith("incorrect: trial 0, output 0"), compiled["error"]

    # a forward that keeps state on the module answers otherwise on every call, eager too:
    # such a mode cannot be checked, and stays a bar, said so (not called incorrect)
    stateful = TASK.replace("class Model(nn.Module):\n", "class Model(nn.Module):\n"
                            "    def __init__(self):\n        super().__init__()\n"
                            "        self.seen = torch.zeros(8, 8)\n\n", 1).replace(
        "        return torch.relu(x) * 2",
        "        self.seen = self.seen + x\n        return torch.relu(self.seen) * 2")
    (tmp_path / "s").mkdir()
    task = task_folder(tmp_path / "s", **{"1_Stateful": stateful}) / "1_Stateful.py"
    result = pike("baseline", task, "--modes", "eager,compile:default", "--out",
                  tmp_path / "out2", "--json", "--config", config)
    assert result.exit_code == 0, result.output
    eager, compiled = json.loads(result.stdout)["baselines"][0]["modes"]
    assert compiled["stats"]["median_ms"] > 0 and compiled["error"] is None
    assert compiled["checked"] is False and "called again" in compiled["check_note"]


def test_a_compile_mode_that_takes_the_child_down_fails_alone(tmp_path: Path,
                                                              config: Path) -> None:
    """A max-autotune build past the phase's limit kills the reference's child, as this
    crash does: the mode is reported failed and the others are still measured (before,
    the whole task was an error and an audit counted it 1.0x)."""
    dies = TASK.replace("import torch\n", "import os\nimport torch\n", 1).replace(
        "        return torch.relu(x) * 2",
        "        if torch.compiler.is_compiling():\n            os._exit(7)\n"
        "        return torch.relu(x) * 2")
    out = tmp_path / "out"
    task = task_folder(tmp_path, **{"1_Dies": dies}) / "1_Dies.py"
    _prebuild_on(config)
    names = ["eager", "compile:default", "compile:reduce-overhead",
             "compile:max-autotune-no-cudagraphs"]
    result = pike("baseline", task, "--modes", ",".join(names), "--out", out, "--json",
                  "--config", config)
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout)["baselines"][0]["modes"]
    assert [m["mode"] for m in modes] == names
    eager, *compiled = modes
    assert eager["stats"]["median_ms"] > 0 and eager["error"] is None
    for mode in compiled:  # each took its child down in turn, each is said so
        assert mode["stats"] is None and "phase 'build'" in mode["error"], mode
    # max-autotune's took its child down in its pre-build first, then alone without one
    said = " ".join(result.stderr.split())
    assert "baseline compile:max-autotune-no-cudagraphs: its pre-build took the " \
           "reference's child down (crashed in phase 'build'" in said, said
    assert compiled[-1]["prebuild_s"] is None


@pytest.mark.slow
def test_a_pre_build_that_takes_the_child_down_fails_nothing(tmp_path: Path,
                                                             config: Path) -> None:
    """A pre-build may only save time: where it ends the child (here: only where the
    compiled graph's cache is off, as in a pre-build), the mode is built again alone, as
    without one, and timed."""
    dies = TASK.replace("import torch\n", "import os\nimport torch\n", 1).replace(
        "        return torch.relu(x) * 2",
        "        if torch.compiler.is_compiling() and not torch._inductor.config.fx_graph_cache:"
        "\n            os._exit(7)\n"
        "        return torch.relu(x) * 2")
    eager, tuned, said = _autotuned_baseline(tmp_path, config, "1_PreDies", dies)
    assert eager["stats"]["median_ms"] > 0
    assert tuned["error"] is None and tuned["stats"]["median_ms"] > 0, tuned
    assert tuned["prebuild_s"] is None and tuned["checked"] is True
    assert "baseline compile:max-autotune-no-cudagraphs: its pre-build took the " \
           "reference's child down (crashed in phase 'build'" in said, said
    assert "(again, in a new child)" in said


@pytest.mark.slow
def test_a_compile_mode_past_its_build_limit_fails_alone(tmp_path: Path, config: Path) -> None:
    """A baseline mode's build has its own limit (`eval.limits.build_seconds`): max-autotune
    on a large CNN made no progress for 300 s on an H200. Past it, the mode fails alone,
    said so, and eager is still timed."""
    hangs = TASK.replace("import torch\n", "import time\nimport torch\n", 1).replace(
        "        return torch.relu(x) * 2",
        "        if torch.compiler.is_compiling():\n            time.sleep(600)\n"
        "        return torch.relu(x) * 2")
    cfg = yaml.safe_load(config.read_text())
    cfg["eval"]["limits"]["build_seconds"] = 8
    config.write_text(yaml.safe_dump(cfg))
    task = task_folder(tmp_path, **{"1_Hangs": hangs}) / "1_Hangs.py"
    result = pike("baseline", task, "--modes", "eager,compile:default", "--out",
                  tmp_path / "out", "--json", "--config", config)
    assert result.exit_code == 0, result.output
    eager, compiled = json.loads(result.stdout)["baselines"][0]["modes"]
    assert eager["stats"]["median_ms"] > 0 and eager["error"] is None
    assert compiled["stats"] is None
    assert "no progress for 8 s in phase 'build'" in compiled["error"], compiled["error"]
    assert 8 <= compiled["build_s"] < 60
    said = " ".join(result.stderr.split())
    assert "1_Hangs: baseline compile:default failed in" in said
    assert "baseline eager built in" in said and "(again, in a new child)" in said


def test_eval_explain_lists_the_guards(config: Path) -> None:
    result = pike("eval", MLP, FUSED, "--no-timing", "--explain", "--config", config)
    assert result.exit_code == 0, result.output
    for guard in ("audit hook", "other distribution", "after timing", "backend flags"):
        assert guard in result.output


def test_a_best_slower_than_eager_is_reported_as_such(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    from pike.cli import _print_result
    from pike.evaluate.verdict import TimingStats, Verdict
    from pike.search.session import OptimizeResult

    def stats(ms: float) -> TimingStats:
        return TimingStats.from_samples([ms] * 5)

    slower = Verdict(status="ok", runtime=stats(2.0), reference=stats(1.0), speedup=0.5)
    faster = Verdict(status="ok", runtime=stats(0.5), reference=stats(1.0), speedup=2.0)
    for verdict, advised in ((slower, True), (faster, False)):
        _print_result(OptimizeResult(run_dir=tmp_path, task="t", best_source="x",
                                     best_verdict=verdict, queries=0, dollars=0.0,
                                     verdicts={"ok": 1}))
        out = capsys.readouterr().out
        assert ("advice" in out) == advised and ("keep your own" in out) == advised


def test_an_interrupted_run_names_the_command_that_goes_on_only_where_there_is_a_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pike.cli import _say_how_to_go_on
    from pike.store import RunStore

    early = tmp_path / "early"  # Ctrl-C before the store was made: nothing to resume
    _say_how_to_go_on(f"pike optimize --resume {early}", early)
    assert "nothing was recorded" in capsys.readouterr().err
    RunStore.create(tmp_path / "run", {}, "test").close()
    _say_how_to_go_on(f"pike optimize --resume {tmp_path / 'run'}", tmp_path / "run")
    said = " ".join(capsys.readouterr().err.split())
    assert f"continue with pike optimize --resume {tmp_path / 'run'}" in said


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit_instead(code: int) -> None:
    raise _Exited(code)


def test_output_closed_under_a_run_ends_it_as_a_ctrl_c_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`pike bench ... | head`: rich turns the write after head has gone into SystemExit(1),
    its console marked quiet. The run then ends at once, its children ended and its temp
    folders removed (no wait on the builds in flight), with rich's exit status; any
    other SystemExit passes through untouched."""
    from pike.commands import interrupt

    ended: list[str] = []
    monkeypatch.setattr(interrupt, "end_children_and_remove_own_dirs",
                        lambda: ended.append("ended"))
    monkeypatch.setattr(interrupt.os, "_exit", _exit_instead)
    # this process's handlers stay
    monkeypatch.setattr(interrupt.signal, "signal", lambda *a: None)
    monkeypatch.setattr(interrupt.logging, "disable", lambda level: None)
    monkeypatch.setattr(interrupt.err_console, "quiet", True)
    with pytest.raises(_Exited) as exited, interrupt.resumable("pike bench --resume r", None):
        raise SystemExit(1)
    assert (exited.value.code, ended) == (1, ["ended"])
    with pytest.raises(_Exited) as exited, interrupt.resumable("pike bench --resume r", None):
        raise KeyboardInterrupt
    assert (exited.value.code, ended) == (130, ["ended", "ended"])
    monkeypatch.setattr(interrupt.err_console, "quiet", False)
    with pytest.raises(SystemExit), interrupt.resumable("pike bench --resume r", None):
        raise SystemExit(2)
    assert ended == ["ended", "ended"]
