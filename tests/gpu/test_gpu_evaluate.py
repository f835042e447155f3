"""The evaluator on a CUDA device: CUDA C++, Triton and PyTorch candidates, GPU failures.

Run on the GPU machine with `pytest -m gpu`; skipped where CUDA is absent.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from pike.config import EvalConfig
from pike.errors import TaskError
from pike.evaluate import evaluate, judge, process_stopper, reference_cache
from pike.evaluate import reference as reference_module
from pike.task import Task
from tests.conftest import candidate

pytestmark = pytest.mark.gpu


@pytest.fixture
def gpu_config(fast_config: EvalConfig) -> EvalConfig:
    fast_config.device = "cuda"
    fast_config.limits.memory_gib = 16
    return fast_config


@pytest.mark.parametrize("name", ["fused", "cuda_gelu", "triton_gelu", "model_named_model"])
def test_correct_candidates_pass_and_are_timed(mlp_task: Task, gpu_config: EvalConfig,
                                               name: str) -> None:
    verdict = evaluate(mlp_task, candidate(name), gpu_config)
    assert verdict.status == "ok", verdict.message
    assert verdict.device == "cuda:0" and verdict.device_name
    assert verdict.runtime and verdict.reference
    # beside other xdist workers' GPU work the reference's window may read slower than its
    # usual: such a verdict is marked noisy and its figure withheld, not given wrong
    assert verdict.speedup or (verdict.noisy and verdict.noisy_speedup)
    assert verdict.runtime.median_ms > 0


@pytest.mark.parametrize(("name", "statuses", "words"), [
    ("cuda_half_written", {"incorrect"}, "values outside"),
    ("cuda_out_of_bounds", {"runtime_error", "crashed"}, "illegal memory access"),
    ("wrong_values", {"incorrect"}, "values outside"),
    ("mutates_input", {"rejected"}, "modified in place"),
    ("aliases_input", {"rejected"}, "shares memory"),
])
def test_gpu_failures_get_their_verdict(mlp_task: Task, gpu_config: EvalConfig, name: str,
                                        statuses: set[str], words: str) -> None:
    verdict = evaluate(mlp_task, candidate(name), gpu_config)
    assert verdict.status in statuses, verdict.message
    assert words in verdict.message


def test_hung_kernel_times_out_and_leaves_nothing(mlp_task: Task, gpu_config: EvalConfig) -> None:
    gpu_config.limits.check_seconds = 15
    verdict = evaluate(mlp_task, candidate("cuda_hang"), gpu_config)
    assert verdict.status == "timeout", verdict.message
    time.sleep(0.5)
    alive = {c.pid for c in psutil.Process().children(recursive=True)
             if c.status() != psutil.STATUS_ZOMBIE}
    # Only the cached reference children, kept to time later candidates against, remain
    # (with what runs them: bwrap and its init, in the OS sandbox), and the evaluator's
    # process stopper, which lives as long as this process.
    cached = {r.child.proc.pid for r in reference_cache._references.values() if r.child and r.child.proc}
    their_own = {c.pid for pid in cached for c in psutil.Process(pid).children(recursive=True)}
    assert alive - {process_stopper.helper_pid()} == cached | their_own


def test_good_kernel_still_passes_after_a_crash(mlp_task: Task, gpu_config: EvalConfig) -> None:
    """A crashed candidate must not poison the device for the next one (separate processes)."""
    assert evaluate(mlp_task, candidate("cuda_out_of_bounds"), gpu_config).status != "ok"
    assert evaluate(mlp_task, candidate("cuda_gelu"), gpu_config).ok


def test_work_on_a_side_stream_is_counted() -> None:
    import torch

    from pike.config import TimingConfig
    from pike.evaluate.timing import time_calls

    cfg = TimingConfig(warmup_calls=1, warmup_seconds=0.0, min_calls=5, min_seconds=0.0)
    device = torch.device("cuda:0")
    side = torch.cuda.Stream(device)
    cycles = 20_000_000  # about 10 ms at H100 clocks

    def on_current_stream() -> None:
        torch.cuda._sleep(cycles)

    def on_side_stream() -> None:  # returns before its work is done, never joins
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)

    honest = sorted(time_calls(on_current_stream, device, cfg))[2]
    escaped = sorted(time_calls(on_side_stream, device, cfg))[2]
    assert honest > 1.0
    assert escaped > 0.9 * honest


def test_a_candidate_hiding_work_on_a_side_stream_is_timed_in_full(
        mlp_task: Task, gpu_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("side_stream"), gpu_config)
    assert verdict.status == "ok", verdict.message
    assert verdict.runtime is not None and verdict.runtime.median_ms > 1.0


@pytest.mark.parametrize(("name", "status"), [
    ("patches_event", "rejected"), ("rewrites_samples", "rejected"),
    ("zeroes_samples", "rejected"),
    ("counts_calls", "incorrect"), ("caches_by_pointer", "incorrect"),
])
def test_cheats_are_caught_on_the_gpu(mlp_task: Task, gpu_config: EvalConfig, name: str,
                                      status: str) -> None:
    gpu_config.timing.min_seconds = 0.5
    # as in tests/test_guards.py: rewrites_samples (and zeroes_samples) forge the calls
    # before their own, so they need blocks of several calls (under load, 5 a block let
    # rewrites_samples through to `ok`)
    gpu_config.timing.min_calls = 100
    verdict = evaluate(mlp_task, candidate(name), gpu_config)
    assert verdict.status == status, verdict.message


def test_the_child_sees_only_its_own_gpu(mlp_task: Task, gpu_config: EvalConfig,
                                         tmp_path) -> None:
    probe = candidate("fused") + (
        "\nimport os\nassert torch.cuda.device_count() == 1, torch.cuda.device_count()\n")
    verdict = evaluate(mlp_task, probe, gpu_config)
    assert verdict.status == "ok", verdict.message


BUILT_ON_THE_GPU = """
import torch
import torch.nn as nn


class {cls}(nn.Module):
    # like level5's tasks: written to be built on the GPU, where the constructor's own work runs
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)
        table = torch.randn(256, 256)
        if not table.is_cuda:
            raise RuntimeError(f"built on {{table.device}}")
        self.register_buffer("table", table @ table.t() / 256)

    def forward(self, x):
        return self.fc(x) @ self.table


def get_inputs():
    return [torch.randn(32, 256)]


def get_init_inputs():
    return []
"""


def test_construct_on_device_builds_both_models_on_the_gpu_alike(
        tmp_path, gpu_config: EvalConfig) -> None:
    path = tmp_path / "1_BuiltOnGpu.py"
    path.write_text(BUILT_ON_THE_GPU.format(cls="Model"))
    task = Task.from_file(path)
    new = BUILT_ON_THE_GPU.format(cls="ModelNew")
    gpu_config.construct_on = "device"
    verdict = evaluate(task, new, gpu_config)
    assert verdict.status == "ok", verdict.message  # weights drawn on the GPU match
    # the meta device cannot build it either: its work is counted on the GPU, built there
    assert verdict.floor_ms and verdict.times_floor
    gpu_config.construct_on = "cpu"  # KernelBench's way: this task's reference cannot run
    with pytest.raises(TaskError, match="reference failed in phase 'init'.*built on cpu"):
        evaluate(task, new, gpu_config)


WIDE_LINEAR = """
import torch
import torch.nn as nn


class {cls}(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, features)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)).sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.rand(8, {features})]


def get_init_inputs():
    return [{features}]
"""


@pytest.mark.parametrize(("features", "built_on"), [(8200, "device"), (1024, "cpu")])
def test_auto_builds_a_task_of_large_weights_on_the_gpu(
        tmp_path, gpu_config: EvalConfig, features: int, built_on: str) -> None:
    """8200 x 8200 fp32 weights are over 256 MiB: with construct_on auto (the default) both
    models are built on the GPU, alike; a small task is built on the CPU as before."""
    path = tmp_path / f"1_Wide{features}.py"
    path.write_text(WIDE_LINEAR.format(cls="Model", features=features))
    task = Task.from_file(path)
    gpu_config.construct_on = "auto"
    reference_cache.close_references()
    verdict = evaluate(task, WIDE_LINEAR.format(cls="ModelNew", features=features), gpu_config)
    assert verdict.status == "ok", verdict.message  # the weights match: built alike
    runs = list(reference_cache._references.values())
    assert [r.request.construct_on for r in runs if r.request] == [built_on]
    reference_cache.close_references()


def test_outputs_compared_on_the_gpu_give_the_hosts_verdict() -> None:
    import math

    from pike.evaluate import check
    torch = pytest.importorskip("torch")
    assert judge.compare_device("cuda").type == "cuda"
    expected = torch.randn(3, 1000)
    actual = expected + 1e-7
    actual[1, 5], actual[2, 9] = math.nan, 3.0
    on_gpu = check.compare_leaf(expected, actual, 0, 0, 1e-4, 1e-4, torch.device("cuda"))
    on_host = check.compare_leaf(expected, actual, 0, 0, 1e-4, 1e-4)
    assert on_gpu.model_dump() == on_host.model_dump() and on_gpu.mismatched == 2



def test_a_references_expected_outputs_are_kept_on_the_gpu_within_their_share(
        mlp_task: Task, gpu_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    reference_cache.close_references()
    first = evaluate(mlp_task, candidate("fused"), gpu_config)
    wrong = evaluate(mlp_task, candidate("wrong_values"), gpu_config)
    assert first.ok and wrong.status == "incorrect", (first.message, wrong.message)
    run = next(iter(reference_cache._references.values()))
    kept = run._on_device
    assert kept is not None and kept is not run.expected
    assert all(x.is_cuda for leaves in kept for x in leaves if isinstance(x, torch.Tensor))
    assert reference_module._kept[run._kept_on] == run._kept_bytes > 0
    reference_cache.close_references()
    assert reference_module._kept[run._kept_on] == 0 and run._on_device is None
    # no room in the share: compared from the mapped files, the same verdicts
    monkeypatch.setattr(reference_module, "_KEPT_SHARE", 0.0)
    again = evaluate(mlp_task, candidate("fused"), gpu_config)
    assert again.ok
    run = next(iter(reference_cache._references.values()))
    assert run._on_device is run.expected and run._kept_bytes == 0
    reference_cache.close_references()


def test_baseline_modes_compile_on_the_build_cores_before_their_window(
        mlp_task: Task, gpu_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile modes are built alone on the device (autotuning measures kernels) but
    with every build core's compile workers, not one, and before the timed blocks."""
    from pike.evaluate import baseline
    from pike.evaluate.cores import build_cores

    threads: list[int] = []
    real = baseline.run_reference

    def spy(task: Task, cfg: EvalConfig, device: str, **kw: object) -> reference_module.ReferenceRun:
        threads.append(cfg.compile_threads)
        return real(task, cfg, device, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(baseline, "run_reference", spy)
    modes = ["eager", "compile:default", "compile:max-autotune-no-cudagraphs"]
    started = time.monotonic()
    base = baseline.measure_baselines(mlp_task, gpu_config, modes)
    print(f"baselines in {time.monotonic() - started:.1f} s:",
          {m.mode: (m.build_s, m.stats and round(m.stats.median_ms, 4)) for m in base.modes})
    assert threads == [max(1, build_cores("cuda:0", gpu_config.timing_cores))]
    assert [m.mode for m in base.modes] == modes
    eager, *compiled = base.modes
    assert all(m.stats and m.stats.median_ms > 0 for m in base.modes), base.modes
    # every mode's build is timed; not compared with eager's: the tests share one build
    # cache, and a mode another test built first loads in a tenth of a second (an H100
    # run of the suite with -n 4, 2026-12-06: max-autotune-no-cudagraphs 0.11 s, eager 1.7 s)
    assert all(m.build_s is not None and m.build_s > 0 for m in base.modes), base.modes
    # each compiled mode answered the check trials as eager did (or says why it could not)
    assert all(m.checked is True for m in compiled), [(m.mode, m.check_note) for m in compiled]


def test_an_autotuning_mode_pre_built_beside_others_is_built_and_checked_again_alone(
        mlp_task: Task, gpu_config: EvalConfig) -> None:
    """eval.prebuild_autotune on (a campaign's baselines beside its searches): the mode
    is compiled once untimed, then built with the device alone, checked against eager's
    check trials and timed; its baseline keeps both build times."""
    from pike.evaluate import baseline

    gpu_config.prebuild_autotune = "on"
    modes = ["eager", "compile:default", "compile:max-autotune-no-cudagraphs"]
    base = baseline.measure_baselines(mlp_task, gpu_config, modes)
    eager, default, tuned = base.modes
    print({m.mode: (m.build_s, m.prebuild_s) for m in base.modes})
    assert tuned.error is None and tuned.checked is True, (tuned.error, tuned.check_note)
    assert tuned.stats and tuned.stats.median_ms > 0
    assert tuned.prebuild_s and tuned.build_s and tuned.build_s > tuned.prebuild_s
    assert default.prebuild_s is None and eager.prebuild_s is None  # nothing to autotune


STATEFUL_RNN = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """33_VanillaRNN's pattern: the hidden state is kept on the module between calls."""

    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(64, 32)
        self.h2o = nn.Linear(32, 8)
        self.hidden = torch.randn(16, 32)

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)
        self.hidden = torch.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))
        return self.h2o(self.hidden)


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
'''


def test_a_stateful_task_s_modes_each_keep_their_own_state(
        tmp_path: Path, gpu_config: EvalConfig) -> None:
    """Each compile mode compiles its own copy of the module. Shared, reduce-overhead's
    CUDA graph output became the module's hidden state, and eager's next call read it
    overwritten: every mode failed (33_VanillaRNN in the level3-pike audit)."""
    from pike.evaluate.baseline import measure_baselines

    path = tmp_path / "1_StatefulRNN.py"
    path.write_text(STATEFUL_RNN)
    modes = ["eager", "compile:reduce-overhead", "compile:default"]
    base = measure_baselines(Task.from_file(path), gpu_config, modes)
    eager, graphs, default = base.modes
    assert [m.mode for m in base.modes] == modes
    assert eager.stats and default.stats, [(m.mode, m.error) for m in base.modes]
    # eager answers each call otherwise (its state moves on): the mode cannot be checked
    assert default.checked is False and default.check_note
    # reduce-overhead fails on its own: the state it keeps is its own graphs' output, as in
    # a user's program without cudagraph_mark_step_begin()
    assert graphs.stats or "CUDAGraphs" in (graphs.error or ""), graphs


def test_holds_are_recorded_by_purpose_and_no_hold_waits_for_a_calibration(
        mlp_task: Task, gpu_config: EvalConfig, tmp_path: Path) -> None:
    """On the GPU: a verdict with the reference's child listed for its start, the check
    after timing held only for the parent's part, and the loop calibrated in the window
    (no hold of its own); the ledger names every exclusive hold's purpose."""
    from pike.evaluate import device_holds

    reference_cache.close_references()
    ledger = tmp_path / device_holds.LEDGER_NAME
    with device_holds.recording(ledger):
        verdict = evaluate(mlp_task, candidate("fused"), gpu_config)
        caught = evaluate(mlp_task, candidate("caches_by_pointer"), gpu_config)
    assert verdict.status == "ok", verdict.message
    assert caught.status != "ok", caught.message  # the check after timing still catches it
    purposes = [h["purpose"] for h in device_holds.read(ledger)]
    assert device_holds.CANDIDATE_WINDOW in purposes, purposes
    assert device_holds.CALIBRATION not in purposes, purposes
    assert set(purposes) <= {device_holds.CANDIDATE_WINDOW, device_holds.CANDIDATE_AGAIN}


def test_every_operator_the_sampler_runs_on_a_gpu_output_is_watched() -> None:
    """As on the CPU (tests/test_timed_calls.py), with the copies to the host a CUDA
    output's samples take."""
    from tests.test_timed_calls import sampler_ops_not_watched

    assert sampler_ops_not_watched("cuda") == []
