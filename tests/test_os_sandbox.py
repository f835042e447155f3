"""Hardening round 2: the OS sandbox, the allow-listed environment, inputs nobody can read
ahead, and secrets masked before any verdict is read. Each attack is a candidate of ours."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from pike.config import EvalConfig
from pike.errors import EvaluatorError
from pike.evaluate import evaluate, os_sandbox
from pike.evaluate.child_environment import child_environment, passed_to_child
from pike.evaluate.child_launch import build_cache_root
from pike.evaluate.redact import MASK, mask_text
from pike.task import Task
from tests.conftest import candidate

# CI installs bubblewrap: there a missing sandbox fails these tests instead of skipping them.
needs_bwrap = pytest.mark.skipif(
    os_sandbox.sandbox_problem() is not None and not os.environ.get("CI"),
    reason=f"no OS sandbox here: {os_sandbox.sandbox_problem()}")


@pytest.fixture
def sandboxed(fast_config: EvalConfig) -> EvalConfig:
    fast_config.sandbox = "required"
    return fast_config


@needs_bwrap
def test_a_new_program_started_by_the_candidate_stays_in_the_sandbox(
        mlp_task: Task, sandboxed: EvalConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "escaped"
    monkeypatch.setenv("PIKE_TEST_TARGET", str(target))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-CANARYCANARYCANARYCANARY")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        monkeypatch.setenv("PIKE_TEST_PORT", str(server.getsockname()[1]))
        verdict = evaluate(mlp_task, candidate("escapes_by_subprocess"), sandboxed)
        with pytest.raises(TimeoutError):
            server.accept()
    assert "escape report" in verdict.message, verdict.message
    assert "write refused" in verdict.message and not target.exists()
    assert "network refused" in verdict.message and "link refused" in verdict.message
    assert "CANARY" not in verdict.model_dump_json()


@needs_bwrap
@pytest.mark.parametrize("name", ["slows_the_reference", "reads_inputs_ahead",
                                  "reads_timed_sets_ahead"])
def test_the_reference_and_the_inputs_are_out_of_sight(mlp_task: Task, sandboxed: EvalConfig,
                                                       name: str) -> None:
    verdict = evaluate(mlp_task, candidate(name), sandboxed)
    assert verdict.status == "ok", verdict.message


@pytest.mark.parametrize("name", ["reads_inputs_ahead", "reads_timed_sets_ahead"])
def test_inputs_of_later_phases_are_not_there_to_read_ahead(mlp_task: Task,
                                                            fast_config: EvalConfig,
                                                            name: str) -> None:
    # reads_timed_sets_ahead: the timed sets (the probes among them) are loaded before the
    # window and their files taken away, so no timed call reads a later call's set ahead
    fast_config.sandbox = "off"  # the staging itself, without the sandbox's mounts
    verdict = evaluate(mlp_task, candidate(name), fast_config)
    assert verdict.status == "ok", verdict.message


def test_secrets_never_reach_a_verdict(mlp_task: Task, fast_config: EvalConfig,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    canaries = {"OPENAI_API_KEY": "sk-canary0123456789abcdefghij",
                "DATABASE_URL": "postgres://pike:canarypw0123@db.example/pike",
                "GITHUB_PAT": "ghp_canary0123456789abcdefghijklmn",
                "MYSQL_PWD": "canary-mysql-0123"}
    for name, value in canaries.items():
        monkeypatch.setenv(name, value)
    # planted where the candidate can read it: masked by its shape
    monkeypatch.setenv("PIKE_TEST_LEAK", "sk-proj-CANARYabcdefghijklmnopqrstuv")
    verdict = evaluate(mlp_task, candidate("leaks_secrets"), fast_config)
    assert verdict.status == "runtime_error" and "leak:" in verdict.message, verdict.message
    dumped = verdict.model_dump_json()
    for value in [*canaries.values(), "canarypw0123", "CANARYabcdefghij"]:
        assert value not in dumped
    assert MASK in verdict.message


def test_credential_shaped_strings_and_the_environments_secrets_are_masked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_SERVICE_CONFIG", "opaque-secret-value-42")
    text = ("key sk-abcdefghijklmnop0123456789 url https://user:hunter2hunter@host/x "
            "token=abcd1234efgh aws AKIAABCDEFGHIJKLMNOP and opaque-secret-value-42; "
            "shape [128, 1024] stays")
    masked = mask_text(text)
    for secret in ("sk-abcdefghijklmnop", "hunter2hunter", "abcd1234efgh", "AKIAABCDEFGH",
                   "opaque-secret-value-42"):
        assert secret not in masked
    assert "shape [128, 1024] stays" in masked and "https://user:" in masked


def test_the_childs_environment_is_an_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "GITHUB_PAT", "MYSQL_PWD", "AWS_SECRET_ACCESS_KEY",
                 "SOMETHING_ELSE", "PIKE_API_KEY", "HF_TOKEN"):
        monkeypatch.setenv(name, "x" * 12)
        assert not passed_to_child(name)
    for name in ("PATH", "CUDA_VISIBLE_DEVICES", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST",
                 "PIKE_TEST_TARGET", "OMP_NUM_THREADS"):
        assert passed_to_child(name)
    home = os.path.realpath(Path.home())
    monkeypatch.setenv("PATH", f"{home}/bin:/usr/bin")
    env = child_environment("/pike/work", "m", "/pike/cache/b", "/pike/cache")
    assert "DATABASE_URL" not in env and env["HOME"] == "/pike/work/home"
    named = [k for k, v in env.items() if home in v and not v.startswith(
        os.path.dirname(os.path.abspath(os.sys.executable)))]
    assert f"{home}/bin" not in env["PATH"].split(os.pathsep), named


@needs_bwrap
def test_explain_lists_the_namespaces_and_mounts(mlp_task: Task, sandboxed: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("fused"), sandboxed)
    assert verdict.ok, verdict.message
    notes = verdict.guards
    for namespace in ("pid", "network", "ipc", "mount", "user"):
        assert namespace in notes["os sandbox"]
    assert "/pike/work (rw)" in notes["mounts"] and "/pike/inputs (ro)" in notes["mounts"]
    assert "timed outputs" in notes and "drawn from the OS" in notes["fresh inputs"]


def test_required_refuses_without_the_tool_and_auto_says_so_once(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PIKE_BWRAP", "/nonexistent/bwrap")
    os_sandbox.sandbox_problem.cache_clear()
    try:
        fast_config.sandbox = "required"
        with pytest.raises(EvaluatorError, match="not installed"):
            evaluate(mlp_task, candidate("fused"), fast_config)
        fast_config.sandbox = "auto"
        verdict = evaluate(mlp_task, candidate("fused"), fast_config)
        assert verdict.ok, verdict.message
        assert "unavailable" in verdict.guards["os sandbox"]
        assert any("no OS sandbox" in r.message for r in caplog.records)
    finally:
        os_sandbox.sandbox_problem.cache_clear()


def test_seeds_are_drawn_for_each_reference_run_unless_fixed(fast_config: EvalConfig) -> None:
    from pike.evaluate.reference_start import draw_protocol

    first, second = draw_protocol(fast_config), draw_protocol(fast_config)
    assert first.weights != second.weights and first.trials != second.trials
    assert first.shift != second.shift and first.shift.scale >= 2.5
    fast_config.seed = 7
    assert draw_protocol(fast_config) == draw_protocol(fast_config)


def test_a_request_file_names_no_seed_of_the_inputs(mlp_task: Task, fast_config: EvalConfig,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import judge, reference_cache, reference_start

    seen: list[dict] = []
    real = judge.begin_child

    def spy(child, *args, **kwargs):  # type: ignore[no-untyped-def]
        real(child, *args, **kwargs)
        seen.append(json.loads((child.work_dir / "request.json").read_text()))

    monkeypatch.setattr(judge, "begin_child", spy)
    monkeypatch.setattr(reference_start, "begin_child", spy)  # the reference's request
    reference_cache.close_references()
    assert evaluate(mlp_task, candidate("fused"), fast_config).ok
    reference, cand = seen[0], seen[-1]
    assert reference["trial_seeds"] and reference["shift"]
    assert cand["trial_seeds"] == [] and cand["pool_seeds"] == [] and cand["shift"] is None


@pytest.mark.parametrize("sandbox", [pytest.param("required", marks=needs_bwrap), "off"])
def test_no_candidate_reaches_the_build_cache_of_the_reference(
        mlp_task: Task, fast_config: EvalConfig, sandbox: str) -> None:
    """The reference's compile modes are every figure's baselines, and what a build cache
    holds is code its reader runs: the reference has a build folder of its own, out of
    the candidates' sight (their shared one is theirs alone). The attack writes only
    where it may, so its verdict is ok either way: what counts is where the file lands."""
    fast_config.sandbox = sandbox  # type: ignore[assignment]
    verdict = evaluate(mlp_task, candidate("poisons_the_build_cache"), fast_config)
    reference = build_cache_root(fast_config, "reference")
    theirs = build_cache_root(fast_config, "candidate")
    assert not reference.is_relative_to(theirs) and not theirs.is_relative_to(reference)
    assert any(reference.iterdir())  # the reference's children have used it
    assert verdict.status == "ok", verdict.message
    assert not list(reference.rglob("pike-poison"))
    assert list(theirs.rglob("pike-poison"))  # the attack ran, in its own cache


def test_system_files_other_users_may_not_read_are_listed_to_hide(tmp_path: Path) -> None:
    (tmp_path / "open.conf").write_text("x")
    (tmp_path / "key").write_text("secret")
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "private").mkdir(mode=0o700)
    (tmp_path / "private" / "inside").write_text("x")
    (tmp_path / "shown").mkdir()
    (tmp_path / "shown" / "token").write_text("t")
    (tmp_path / "shown" / "token").chmod(0o640)
    (tmp_path / "link").symlink_to(tmp_path / "key")
    found = os_sandbox.private_entries((str(tmp_path),), 1000)
    assert sorted(found) == sorted([(str(tmp_path / "key"), False),
                                    (str(tmp_path / "private"), True),
                                    (str(tmp_path / "shown" / "token"), False)])


@needs_bwrap
def test_a_child_reads_no_system_file_that_other_users_may_not(tmp_path: Path) -> None:
    """Inside, the child is its namespace's root, the real root where pike runs as root:
    as the owner it read /etc/shadow until such files were hidden."""
    hidden = [p for p, folder in os_sandbox._private_system_entries() if not folder]
    if not hidden:
        pytest.skip("no file in /etc or /opt here that other users may not read")
    plan = os_sandbox.SandboxPlan()
    done = subprocess.run([*plan.prefix(), "/bin/sh", "-c", f"cat '{hidden[0]}' | wc -c"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


@needs_bwrap
def test_a_child_sees_no_firmware_tables_nor_serial_numbers() -> None:
    present = [p for p in os_sandbox._HIDDEN_SYS if os.path.isdir(p) and os.listdir(p)]
    if not present:
        pytest.skip("none of the hidden /sys folders holds anything here")
    listing = "; ".join(f"ls -A '{p}' | wc -l" for p in present)
    done = subprocess.run([*os_sandbox.SandboxPlan().prefix(), "/bin/sh", "-c", listing],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"] * len(present)
