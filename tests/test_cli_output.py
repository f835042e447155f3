"""Every `pike` command as it reads in a log, CI or a pipe: whole lines (no status line cut
into the next one, no carriage returns or colour codes), no source locations of pike's own
code, checks that fail before work starts said before anything else, and `--version`.

Each command runs once, as a user's shell runs it (a child process with its stdout and
stderr piped), over one shared set of runs; the tests then read what each printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

import pike
from pike.solution_set import read_set
from tests.conftest import CANDIDATES, EXAMPLES
from tests.fake_openai import FakeOpenAI
from tests.test_optimize import GOOD, WRONG, Scripted

MLP = str(EXAMPLES / "tasks" / "1_GeluMLP.py")
TASKS = str(EXAMPLES / "tasks")
# pike's own modules: `progress.py:38` beside a line means nothing to a user
PIKE_FILES = sorted({p.name for p in Path(pike.__file__).parent.rglob("*.py")})
SOURCE_LOCATION = re.compile(rf"\b(?:{'|'.join(map(re.escape, PIKE_FILES))}):\d+")
# a status line, whole: time, [phase], task, then only the fields of its strategy
STATUS = re.compile(r"^\d\d:\d\d:\d\d (\[[^\]]+\] )?\S+: (round|generation) \d+"
                    r"( \| budget [^|]+)? \| best (-|[\d.]+x) \| verdicts: [^|]+"
                    r"( \| rescued by fixer: \d+)?$")


@dataclass
class Printed:
    """What one command printed, and how it exited."""

    args: list[str]
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return (self.stdout + self.stderr).splitlines()


def cpu_config(path: Path, build_cache: Path) -> Path:
    """A fast CPU protocol, eager as the only baseline, a short offline search."""
    path.write_text(yaml.safe_dump({
        "runs_dir": str(path.parent / "runs"),
        "eval": {"device": "cpu", "trials": 2, "build_cache": str(build_cache),
                 "timing": {"warmup_calls": 1, "warmup_seconds": 0.0, "min_calls": 5,
                            "min_seconds": 0.02, "rounds": 2},
                 "limits": {"load_seconds": 120, "check_seconds": 30, "timing_seconds": 60,
                            "memory_gib": 2}},
        "llm": {"retry_wait_s": 0.01, "max_retries": 1, "timeout_s": 20, "max_tokens": 200},
        "search": {"offline": {"max_candidates": 1, "max_seconds": 60}, "confirm_top": 1,
                   "baseline_modes": ["eager"],
                   "branching": {"branches": 2, "max_fix_attempts": 1, "top_k": 2}},
    }))
    return path


# `pike eval`'s exit 0 rests on an `ok` verdict, which rests on this host's timing (the
# wall-clock guard rejected the honest candidate beside another test process in CI): alone
pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory, build_cache: Path,
            ) -> Iterator[dict[str, Printed]]:
    root = tmp_path_factory.mktemp("piped")
    cfg = str(cpu_config(root / "pike.yaml", build_cache))
    runs = root / "runs"
    fake = FakeOpenAI()
    fake.handler = Scripted(optimize=[WRONG, GOOD])
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "COLUMNS")}
    # the commands that read no other command's output run at once (each is mostly waiting
    # on its evaluation children); those that read a run follow, at once too, and the
    # audit of the exported set last
    independent = {
        "version": ["--version"],
        "eval": ["eval", MLP, str(CANDIDATES / "fused.py"), "--config", cfg],
        "baseline": ["baseline", MLP, "--modes", "eager", "--config", cfg],
        "optimize offline": ["optimize", MLP, "--config", cfg, "--out", str(runs / "off")],
        "optimize llm": ["optimize", MLP, "--llm", fake.spec(), "--budget-queries", "4",
                         "--config", cfg, "--out", str(runs / "llm")],
        "optimize no key": ["optimize", MLP, "--llm", "openai:gpt-5", "--config", cfg],
        "bench": ["bench", TASKS, "--tasks", "1", "--config", cfg, "--out",
                  str(runs / "bench")],
        "audit help": ["audit", "--help"],
    }
    reading = {
        "show": ["show", str(runs / "llm")],
        "report": ["report", str(runs / "off"), str(runs / "bench"), "--out",
                   str(root / "report")],
        "export": ["export", str(runs / "off"), "--out", str(root / "best.py")],
        "export set": ["export", str(runs / "off"), "--set", str(root / "set")],
    }
    audit = ["audit", str(root / "set"), TASKS, "--tasks", "1", "--config", cfg, "--out",
             str(runs / "audit")]
    printed: dict[str, Printed] = {}
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            for commands in (independent, reading):
                started = {name: pool.submit(run_piped, args, env, root)
                           for name, args in commands.items()}
                printed.update({name: future.result() for name, future in started.items()})
        printed["audit"] = run_piped(audit, env, root)
        yield printed
    finally:
        fake.close()


def run_piped(args: list[str], env: dict[str, str], cwd: Path) -> Printed:
    done = subprocess.run([sys.executable, "-m", "pike", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=400)
    return Printed(args, done.returncode, done.stdout, done.stderr)


EXPECTED_CODES = {"optimize no key": 2}


def test_every_command_prints_whole_plain_lines(printed: dict[str, Printed]) -> None:
    for name, out in printed.items():
        assert out.code == EXPECTED_CODES.get(name, 0), (name, out.stderr[-3000:])
        text = out.stdout + out.stderr
        assert "\r" not in text and "\x1b[" not in text, name
        assert "Traceback" not in text, (name, text[-3000:])
        for line in out.lines:
            assert not SOURCE_LOCATION.search(line), (name, line)
            if " | best " in line:
                assert STATUS.match(line), (name, line)
            if "error:" in line:
                assert line.startswith("error:"), (name, line)


def test_version_is_the_package_version(printed: dict[str, Printed]) -> None:
    assert printed["version"].stdout == f"pike {version('pike-torch')}\n"


def test_a_missing_key_is_said_before_any_status(printed: dict[str, Printed]) -> None:
    out = printed["optimize no key"]
    assert out.stdout == ""
    assert out.stderr == "error: OPENAI_API_KEY is not set: export it to use openai:gpt-5\n"


def test_status_fields_follow_the_strategy(printed: dict[str, Printed]) -> None:
    offline = [line for line in printed["optimize offline"].lines if STATUS.match(line)]
    llm = [line for line in printed["optimize llm"].lines if STATUS.match(line)]
    assert offline and llm
    assert not any("budget" in line or "fixer" in line for line in offline)
    assert all(" | budget " in line and "rescued by fixer" in line for line in llm)
    bench = [line for line in printed["bench"].lines if STATUS.match(line)]
    assert bench and all(line.split(" ", 1)[1].startswith("[") for line in bench)


def test_an_audit_shows_its_files_verdicts_not_search_fields(printed: dict[str, Printed]) -> None:
    lines = printed["audit"].lines
    # the search's best below eager on this loaded host (four commands at once): the set
    # keeps the reference, and the audit says the task has no file (a clean-clone CI run)
    kept = read_set(Path(printed["export set"].args[-1])).entry("1_GeluMLP")
    done = (r"\[done\] 1_GeluMLP: missing$" if kept is not None and kept.status == "slower"
            else r"\[done\] 1_GeluMLP: ok [\d.]+x$")
    # (what the task's lines said, where it fails: under load once, not reproduced alone)
    assert any(re.search(done, line) for line in lines), [
        line for line in lines if "1_GeluMLP" in line or "WARNING" in line]
    assert not any(" | best " in line for line in lines)


def test_help_names_the_arguments(printed: dict[str, Printed]) -> None:
    usage = next(line for line in printed["audit help"].lines if "Usage:" in line)
    assert "pike audit [OPTIONS] [SOLUTIONS] [TASKS]" in usage  # or --resume RUN_DIR
    assert "{" not in usage


def test_report_counts_what_ran(printed: dict[str, Printed]) -> None:
    out = printed["report"].stdout
    assert re.search(r"offline · off\s*│\s*1\s*│\s*1\s*│\s*0\s*│\s*0\s*│", out), out
    assert out.rstrip().endswith("index.html")
