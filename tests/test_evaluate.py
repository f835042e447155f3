"""Every failure class gets its own status and a message that names the problem."""

from __future__ import annotations

import os
import time
import uuid

import psutil
import pytest

from pike.config import EvalConfig
from pike.evaluate import (
    candidate_limits,
    candidate_windows,
    evaluate,
    judge,
    os_sandbox,
    process_stopper,
    reference_cache,
)
from pike.evaluate.protocol import DESCENDANTS_GRACE_S
from pike.evaluate.reference_cache import close_references
from pike.task import Task
from tests.conftest import candidate

CASES = [
    # candidate file, status, phase, words the message must contain
    ("wrong_values", "incorrect", "check", "values outside atol=0.01"),
    ("wrong_shape", "incorrect", "check", "shape [64, 255] != expected [64, 256]"),
    ("syntax_error", "compile_error", "load", "candidate.py:7: SyntaxError"),
    ("no_model", "compile_error", "load", "defines none of ModelNew, Model"),
    ("init_raises", "runtime_error", "init", "ValueError: weights file missing"),
    ("forward_raises", "runtime_error", "check", "RuntimeError"),
    # infinite_loop ("timeout", "check"): in test_a_stuck_candidate_is_killed_at_once_after_
    # its_timeout, which judges it once for both (its seconds of a busy loop are the costliest)
    ("segfault", "crashed", "check", "killed by signal SIGSEGV"),
    ("memory_hog", "crashed", "check", "exceeded the memory limit"),
    ("exits_early", "crashed", "check", "exited with status 0 before reporting a result"),
    ("aliases_input", "rejected", "check", "shares memory with an input"),
    ("mutates_input", "rejected", "check", "modified in place"),
    ("cached", "incorrect", "check", "identical for different inputs"),
    ("spawns_child", "rejected", "cleanup", "left processes running"),
    # an empty environment in a new session escapes every check but the OS sandbox's
    pytest.param("double_forks", "rejected", "cleanup", "left processes running", id="double_forks",
                 marks=pytest.mark.skipif(os_sandbox.sandbox_problem() is not None
                                          and not os.environ.get("CI"),
                                          reason="needs the OS sandbox (bubblewrap)")),
]


@pytest.mark.parametrize(("name", "status", "phase", "words"), CASES,
                         ids=[c[0] if isinstance(c[0], str) else None for c in CASES])
def test_failure_classes(mlp_task: Task, fast_config: EvalConfig, name: str, status: str,
                         phase: str, words: str) -> None:
    verdict = evaluate(mlp_task, candidate(name), fast_config)
    assert (verdict.status, verdict.phase) == (status, phase), verdict.message
    assert words in verdict.message
    assert len(verdict.message) <= 4500
    assert verdict.speedup is None and verdict.runtime is None


def test_a_stuck_candidate_is_killed_at_once_after_its_timeout(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    """A child past its phase limit cannot answer "stop": waiting the grace period for it
    (as the evaluator once did) only held up the next evaluation."""
    # a check limit of a few seconds: the loop never ends, and what is timed is the kill
    cfg = fast_config.model_copy(update={"limits": fast_config.limits.model_copy(
        update={"check_seconds": 5.0})})
    evaluate(mlp_task, candidate("fused"), cfg)  # the task's reference is ready
    started = time.monotonic()
    verdict = evaluate(mlp_task, candidate("infinite_loop"), cfg)
    elapsed = time.monotonic() - started
    assert (verdict.status, verdict.phase) == ("timeout", "check"), verdict.message
    assert "no progress for 5 s in phase 'check'" in verdict.message
    assert len(verdict.message) <= 4500
    assert verdict.speedup is None and verdict.runtime is None
    in_phases = sum(s for phase, s in verdict.phase_seconds.items() if phase != "total")
    assert elapsed - in_phases < DESCENDANTS_GRACE_S / 2, (elapsed, verdict.phase_seconds)


_SLOW_FIRST_CALL = """
import math
import time
import uuid

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.built = False

    def forward(self, x):
        if not self.built:  # as a lazy build does{names}
            time.sleep(5)
            self.built = True
        h = self.fc1(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.fc2(h)
"""


def test_a_candidate_that_builds_in_its_first_call_has_a_builds_limit_there(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    """A candidate's trials keep the check limit; its first call, where torch.compile and
    Triton build, gets `limits.build_seconds` where its source uses them (max-autotune
    candidates were judged `timeout` at the fitted 30 s beside other evaluations)."""
    cfg = fast_config.model_copy(update={"limits": fast_config.limits.model_copy(
        update={"check_seconds": 3.0, "build_seconds": 30.0})})
    plain = evaluate(mlp_task, _SLOW_FIRST_CALL.format(names=""), cfg)
    assert (plain.status, plain.phase) == ("timeout", "check"), plain.message
    assert "no progress for 3 s" in plain.message
    compiled = evaluate(mlp_task, _SLOW_FIRST_CALL.format(names=", as torch.compile's"), cfg)
    assert compiled.status == "ok", compiled.message
    assert compiled.phase_seconds["check"] > 5


@pytest.mark.parametrize(("line", "builds"), [
    ("self.f = torch.compile(self.f, mode='max-autotune')", True),
    ("import triton", True), ("import torch, triton", True),
    ("import triton.language as tl", True), ("@triton.autotune(configs=[])", True),
    ("from torch import compile", True), ("torch._dynamo.optimize('inductor')(f)", True),
    ("from torch.utils.cpp_extension import load_inline", False),  # builds at import
    ("x = torch.compiled_with_cxx11_abi()", False), ("import tritonish", False),
])
def test_which_candidates_build_in_their_first_call(line: str, builds: bool) -> None:
    cfg = EvalConfig(device="cpu")
    expected = cfg.limits.build_seconds if builds else None
    assert candidate_limits.first_call_limit(f"import torch\n{line}\n", cfg) == expected


def test_correct_faster_candidate_is_ok_and_timed(mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.status == "ok", verdict.message
    assert verdict.trials_passed == verdict.trials == 3
    assert verdict.max_abs_error is not None and verdict.max_abs_error < 1e-4
    assert verdict.runtime and verdict.reference
    assert verdict.runtime.count >= 5 and verdict.reference.count >= 5
    assert verdict.runtime.q1_ms <= verdict.runtime.median_ms <= verdict.runtime.q3_ms
    assert verdict.speedup == pytest.approx(
        verdict.reference.median_ms / verdict.runtime.median_ms)
    assert verdict.torch_version and verdict.device == "cpu"
    # where its models were built, as the reference settled construct_on (auto: a small task)
    assert fast_config.construct_on == "auto" and verdict.built_on == "cpu"
    assert verdict.timed_rounds is None  # timed in every round


def test_slower_candidate_reports_speedup_below_one(mlp_task: Task,
                                                    fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("slower"), fast_config)
    assert verdict.status == "ok", verdict.message
    # on the loaded 2-core CI host the reference's drift may withhold the figure (noisy,
    # seen once in CI at 829554e): still measured, and still below one
    figure = verdict.noisy_speedup if verdict.noisy else verdict.speedup
    assert figure is not None and figure < 1.0, (verdict.speedup, verdict.noisy,
                                                 verdict.noisy_why, verdict.noisy_speedup)
    # six times the work, but on the CPU no window stops other evaluations: timed whole
    assert verdict.timed_rounds is None


def test_candidate_class_may_be_named_model(mlp_task: Task, fast_config: EvalConfig) -> None:
    assert evaluate(mlp_task, candidate("model_named_model"), fast_config).ok


def test_candidate_that_loads_the_reference_file_is_rejected(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    # Without the OS sandbox the file is there to load, and the in-process check names it.
    fast_config.sandbox = "off"
    source = candidate("uses_reference").replace("TASK_PATH", str(mlp_task.path))
    verdict = evaluate(mlp_task, source, fast_config)
    assert verdict.status == "rejected"
    assert "runs code from the reference task file" in verdict.message


def test_in_the_os_sandbox_the_task_file_is_not_there_to_load(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    fast_config.sandbox = "required"
    source = candidate("uses_reference").replace("TASK_PATH", str(mlp_task.path))
    verdict = evaluate(mlp_task, source, fast_config)
    assert not verdict.ok
    assert "No such file" in verdict.message and str(mlp_task.path) in verdict.message


def test_secrets_and_home_are_hidden(mlp_task: Task, fast_config: EvalConfig,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("HF_TOKEN", "hf-test")
    monkeypatch.setenv("PIKE_TEST_REAL_HOME", os.path.expanduser("~"))
    verdict = evaluate(mlp_task, candidate("reads_secrets"), fast_config)
    assert verdict.status == "ok", verdict.message


def _sleepers() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [])[:2] == ["sleep", "300"]:
            found.append(p)
    return found


def test_no_process_outlives_its_evaluation(mlp_task: Task, fast_config: EvalConfig) -> None:
    before = {p.pid for p in _sleepers()}
    evaluate(mlp_task, candidate("spawns_child"), fast_config)
    time.sleep(0.2)
    assert {p.pid for p in _sleepers()} - before == set()
    # The reference child stays alive, cached, to time the next candidate against.
    cached = {r.child.proc.pid for r in reference_cache._references.values() if r.child and r.child.proc}
    # and the evaluator's process stopper, which lives as long as this process
    helper = {process_stopper.helper_pid()} - {None}
    assert {c.pid for c in _live_children(recursive=False)} - helper == cached
    close_references()
    assert [c for c in _live_children() if c.pid not in helper] == []


def _live_children(recursive: bool = True) -> list[psutil.Process]:
    children = psutil.Process().children(recursive=recursive)
    return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_timing_can_be_skipped(mlp_task: Task, fast_config: EvalConfig) -> None:
    fast_config.time_candidate = False
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.ok and verdict.runtime is None and verdict.speedup is None


def test_tolerance_is_configurable(mlp_task: Task, fast_config: EvalConfig) -> None:
    fast_config.atol = fast_config.rtol = 10.0
    fast_config.time_candidate = False
    assert evaluate(mlp_task, candidate("wrong_values"), fast_config).ok


@pytest.mark.slow
def test_cpp_extension_that_fails_to_build(mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("cpp_compile_error"), fast_config)
    assert (verdict.status, verdict.phase) == ("compile_error", "load")
    assert "undefined_name" in verdict.message and "error" in verdict.message
    assert len(verdict.message) < 4500


@pytest.mark.slow
def test_cpp_extension_builds_once_and_passes(mlp_task: Task, fast_config: EvalConfig) -> None:
    # a source no other test builds: the first load here is the compiler's
    source = f"# {uuid.uuid4().hex}\n" + candidate("cpp_gelu")
    first = evaluate(mlp_task, source, fast_config)
    assert first.status == "ok", first.message
    second = evaluate(mlp_task, source, fast_config)
    assert second.status == "ok"
    # the build cache is keyed by source: the second load skips the compiler
    assert second.phase_seconds["load"] < first.phase_seconds["load"] / 3


def test_a_process_that_ends_soon_after_the_last_call_is_not_left_behind(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    # inductor's compile workers stop a moment after their pool is shut down (H100,
    # compile_threads 4: torch.compile candidates were rejected for it before)
    verdict = evaluate(mlp_task, candidate("child_exits_late"), fast_config)
    assert verdict.status == "ok", verdict.message


def test_a_crashed_childs_output_is_kept_outside_the_scratch_and_named_in_its_verdict(
        mlp_task: Task, fast_config: EvalConfig, tmp_path: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's output file is a nameless one in the temp folder: a scratch filled by
    other evaluations' tensors cannot cut it, the child's folder holds no log, and once
    the child is gone nothing of it is left."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    crash = candidate("fused").replace(
        "class ModelNew", "import os as _os, sys as _sys\n\n"
        "def _die():\n"
        "    _sys.stderr.write('pike-test: the last words of the child\\n')\n"
        "    _sys.stderr.flush()\n"
        "    _os._exit(3)\n\n\n"
        "class ModelNew", 1).replace("def forward(self, x):", "def forward(self, x):\n"
                                     "        _die()", 1)
    from pike.evaluate.sandbox import ChildProcess

    where: list[str] = []
    real = ChildProcess.output_tail

    def output_tail(self: ChildProcess, limit: int = 2000) -> str:
        where.append(os.readlink(f"/proc/self/fd/{self._log.fileno()}"))
        return real(self, limit)

    monkeypatch.setattr(ChildProcess, "output_tail", output_tail)
    verdict = evaluate(mlp_task, crash, fast_config)
    assert verdict.status == "crashed" and "exited with status 3" in verdict.message
    assert verdict.message.rstrip().endswith("pike-test: the last words of the child")
    assert where and all(w.startswith(str(tmp_path)) and w.endswith("(deleted)")
                         for w in where), where


def test_a_candidate_s_timed_inputs_are_loaded_before_its_window(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # Loaded by the window's first block, up to 7 GiB on a level2 task moved with the
    # device held alone and every other evaluation stopped.
    staged_at_window: list[set[str]] = []
    window = judge._timing_window

    def watched(reference: object, child: judge.ChildProcess, *args: object, **kw: object):
        assert child.stage is not None
        staged_at_window.append(set(child.stage.staged))
        # loaded, and their files gone from the child's folder before any timed call
        assert not list(child.stage.folder.glob("pool_*")), list(child.stage.folder.iterdir())
        return window(reference, child, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(judge, "_timing_window", watched)
    monkeypatch.setattr(candidate_windows, "_timing_window", watched)  # a steady window's
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.status == "ok", verdict.message
    assert staged_at_window and all("timing" in s for s in staged_at_window)
    assert "stage_timed_inputs" in verdict.steps


def test_timed_inputs_that_do_not_load_are_the_candidate_s_verdict_with_no_window(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate.verdict import Verdict

    out_of_memory = Verdict(status="runtime_error", phase="timing",
                            message="torch.OutOfMemoryError: CUDA out of memory")
    monkeypatch.setattr(judge, "stage_timed_inputs", lambda child: out_of_memory)
    for module in (judge, candidate_windows):
        monkeypatch.setattr(module, "_timing_window", lambda *a, **kw: pytest.fail("timed"))
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert (verdict.status, verdict.phase) == ("runtime_error", "timing")
    assert "out of memory" in verdict.message and verdict.speedup is None
