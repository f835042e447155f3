"""A candidate that ran out of GPU memory: its verdict says who held the rest of the card."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pike.evaluate import gpu_holders

CARD0, CARD1 = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-99aa88bb-0000-1111-2222-3333"


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake nvidia-smi on PATH that answers the two queries as the real one does
    (csv, no header, no units), listing the given (pid, card, MiB) rows."""
    def install(apps: list[tuple[int, str, int]]) -> None:
        script = tmp_path / "nvidia-smi"
        cards = f"0, {CARD0}\\n1, {CARD1}\\n"
        rows = "".join(f"{pid}, {card}, {mib}\\n" for pid, card, mib in apps)
        script.write_text(
            "#!/bin/sh\n"
            f'case "$1" in --query-gpu=*) printf "{cards}";; '
            f'--query-compute-apps=*) printf "{rows}";; *) exit 2;; esac\n')
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def _child(role: str, module: str, sha: str, phase: str, proc: object) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(role=role, module_path=module,
                                                   task_sha256=sha),
                           phase=phase, proc=proc)


def test_the_line_names_pike_s_own_children_and_the_others_on_that_card(smi) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        smi([(sleeper.pid, CARD0, 53_248), (os.getpid(), CARD0, 512),
             (999_999, CARD1, 70_000), (4_000_000, CARD0, 1024)])
        reference = _child("reference", "/pike/task/14_llama2_decode.py", "abc", "idle",
                           sleeper)
        line = gpu_holders.holders_line("cuda:0", [reference])
        assert line is not None
        assert line.startswith("GPU memory held after it ran out: 52.0 GiB by the "
                               f"reference of 14_llama2_decode (idle, pid {sleeper.pid})")
        assert f"0.5 GiB by pike itself (pid {os.getpid()})" in line
        assert "1.0 GiB by another process (pid 4000000)" in line
        assert "68.4" not in line  # the other card's process is not this card's
        # the other card, through CUDA_VISIBLE_DEVICES: cuda:0 of this process is card 1
        os.environ["CUDA_VISIBLE_DEVICES"] = "1"
        assert gpu_holders.holders_line("cuda:0", [reference]) == (
            "GPU memory held after it ran out: 68.4 GiB by another process (pid 999999)")
        os.environ["CUDA_VISIBLE_DEVICES"] = CARD1[:12]  # a UUID's prefix names it too
        assert "68.4 GiB" in (gpu_holders.holders_line("cuda:0", []) or "")
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        sleeper.kill()
        sleeper.wait()


def test_a_candidate_is_named_by_its_task_and_its_processes_count_as_it(smi) -> None:
    # a child whose process runs another (bwrap's runner under it): both are the child's
    outer = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys, time; "
                              "p = subprocess.Popen([sys.executable, '-c', "
                              "'import time; time.sleep(30)']); print(p.pid, flush=True); "
                              "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert outer.stdout is not None
        inner = int(outer.stdout.readline())
        smi([(inner, CARD0, 26_838)])
        children = [_child("reference", "/t/3_CausalAttention.py", "s1", "idle", None),
                    _child("candidate", "/pike/work/candidate.py", "s1", "init", outer),
                    _child("reference", "/t/other.py", "s2", "idle", SimpleNamespace(pid=1))]
        children[0].proc = SimpleNamespace(pid=outer.pid + 10**6)  # gone: no processes
        line = gpu_holders.holders_line("cuda", children)
        assert line == ("GPU memory held after it ran out: 26.2 GiB by a candidate of "
                        f"3_CausalAttention (init, pid {outer.pid})")
    finally:
        outer.kill()
        outer.wait()


def test_nothing_is_said_without_nvidia_smi_or_on_a_cpu(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    assert gpu_holders.holders_line("cuda:0", []) is None
    assert gpu_holders.said_in("CUDA out of memory.", "cuda:0") == "CUDA out of memory."
    assert gpu_holders.holders_line("cpu", []) is None


def test_a_failing_or_hanging_nvidia_smi_says_nothing(smi, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpu_holders.holders_line("cuda:0", []) is None
    script.write_text("#!/bin/sh\nsleep 5\n")
    monkeypatch.setattr(gpu_holders, "_QUERY_TIMEOUT_S", 0.2)
    assert gpu_holders.holders_line("cuda:0", []) is None


def test_a_started_child_is_named_until_it_is_gone() -> None:
    child = _child("reference", "/t/1_x.py", "s", "idle", SimpleNamespace(pid=123))
    holder = type("Held", (), {})()  # a weakly referencable stand-in for a ChildProcess
    holder.__dict__.update(vars(child))
    gpu_holders.started(holder)  # type: ignore[arg-type]
    assert holder in gpu_holders._live
    del holder
    import gc
    gc.collect()
    assert not any(getattr(c, "proc", None) and c.proc.pid == 123 for c in gpu_holders._live)


def test_a_failure_to_tell_leaves_the_verdict_s_message_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(device: str) -> str:
        raise RuntimeError("psutil went away")

    monkeypatch.setattr(gpu_holders, "holders_line", broken)
    assert gpu_holders.said_in("CUDA out of memory.", "cuda:0") == "CUDA out of memory."


_ASKS_TOO_MUCH = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.huge = torch.empty(2**40, device="cuda")  # 4 TiB: no card has it

    def forward(self, x):
        return self.fc(x)
'''


@pytest.mark.gpu
def test_a_candidate_out_of_gpu_memory_is_told_who_held_the_card(build_cache: Path) -> None:
    """On a real card and nvidia-smi: the verdict names the task's reference child, which
    still holds its model when the line is read."""
    import shutil

    import torch

    from pike.config import EvalConfig
    from pike.evaluate import evaluate
    from pike.task import Task
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        pytest.skip("needs a CUDA device and nvidia-smi")
    task = Task.from_file(Path(__file__).resolve().parent.parent / "examples" / "tasks"
                          / "1_GeluMLP.py")
    verdict = evaluate(task, _ASKS_TOO_MUCH,
                       EvalConfig(device="cuda", trials=2, build_cache=build_cache))
    assert verdict.status in ("runtime_error", "crashed"), verdict.message
    assert "GPU memory held after it ran out:" in (verdict.message or ""), verdict.message
    assert "by the reference of 1_GeluMLP" in verdict.message, verdict.message
