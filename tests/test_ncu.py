"""Nsight Compute metrics of the top kernels (EvalConfig.ncu): ncu's CSV read back, a clean
one-line skip where ncu is missing, the metrics on the profile and in its rendering, and
no failure of any kind reaching the evaluation."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

from pike.config import EvalConfig, LimitsConfig
from pike.evaluate import ncu
from pike.evaluate.os_sandbox import sandbox_problem
from pike.evaluate.profile import KernelMetrics, OpTime, ProfileSummary, profile_calls, render
from tests.conftest import CANDIDATES, EXAMPLES

MLP = EXAMPLES / "tasks" / "1_GeluMLP.py"
FUSED = CANDIDATES / "fused.py"

# ncu's `--csv --page details` layout: one row per launch (ID) and metric, after ncu's own
# ==PROF== lines. Launch 0 and 2 are one kernel, launch 1 another; one counter is n/a.
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')
SAMPLE = "\n".join([
    "==PROF== Connected to process 5151 (/usr/bin/python3.12)",
    '==PROF== Profiling "gemm_tile" - 0: 0%....50%....100% - 4 passes',
    HEADER,
    *(f'"{launch}","5151","python3.12","127.0.0.1","{kernel}","1","7","(128, 1, 1)",'
      f'"(512, 1, 1)","0","9.0","Command line profiler metrics","{metric}","{unit}","{value}"'
      for launch, kernel, metric, unit, value in [
          (0, "void gemm_tile<float>(const float *, float *, int)",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "40.00"),
          (0, "void gemm_tile<float>(const float *, float *, int)",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "70.00"),
          (0, "void gemm_tile<float>(const float *, float *, int)",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "20.00"),
          (0, "void gemm_tile<float>(const float *, float *, int)",
           "gpu__time_duration.sum", "nsecond", "1,204.00"),  # not one of ours
          (1, "gelu_fused", "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "88.50"),
          (1, "gelu_fused", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "n/a"),
          (1, "gelu_fused", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "1,001.5"),
          (2, "void gemm_tile<float>(const float *, float *, int)",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "50.00"),
          (2, "void gemm_tile<float>(const float *, float *, int)",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "80.00"),
          (2, "void gemm_tile<float>(const float *, float *, int)",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "30.00"),
      ]),
]) + "\n"


def test_the_csv_gives_each_kernels_mean_over_its_launches() -> None:
    gemm, gelu = ncu.parse_csv(SAMPLE)
    assert gemm.name.startswith("void gemm_tile<float>") and gemm.launches == 2
    assert (gemm.achieved_occupancy_pct, gemm.dram_throughput_pct,
            gemm.sm_throughput_pct) == (45.0, 75.0, 25.0)
    assert gelu.launches == 1 and gelu.achieved_occupancy_pct == 88.5
    assert gelu.dram_throughput_pct is None  # n/a stays unknown, not 0
    assert gelu.sm_throughput_pct == 1001.5  # thousands separators are read
    assert ncu.parse_csv("==PROF== Disconnected from process 5151\n") == []


def test_the_command_asks_for_our_metrics_on_the_top_kernels_only() -> None:
    report = Path("/tmp/r.ncu-rep")
    names = ["void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, "
             "at::native::GeluCUDAKernelImpl", "ampere_sgemm_128x64_tn", "Memcpy HtoD (Pageable"]
    command = ncu.ncu_command("/usr/bin/ncu", ["python", "-m", "x"], names, report)
    assert command[0] == "/usr/bin/ncu" and command[-3:] == ["python", "-m", "x"]
    assert command[command.index("--metrics") + 1].split(",") == list(ncu.METRICS)
    assert command[command.index("--nvtx-include") + 1] == "pike/"
    assert int(command[command.index("--launch-count") + 1]) > 0
    assert command[command.index("--kernel-name") + 1] == \
        "regex:HtoD|ampere_sgemm_128x64_tn|vectorized_elementwise_kernel"
    assert "--kernel-name" not in ncu.ncu_command("ncu", ["t"], [], report)


@pytest.mark.parametrize("seed", [None, 7])
def test_the_target_parses_what_pike_passes_with_or_without_a_seed(seed: int | None) -> None:
    """Seeds are drawn per evaluation when none is configured; passing `--seed None` made
    the target exit with a usage error (2) under ncu, so no report was ever written."""
    from pike.config import EvalConfig
    from pike.evaluate import ncu_target

    cfg = EvalConfig(seed=seed, model_mode="eval", construct_on="device")
    command = ncu.target_command(Path("t.py"), Path("m.py"), "cuda:1", cfg)
    assert command[1:3] == ["-m", "pike.evaluate.ncu_target"]
    args = ncu_target.arguments().parse_args(command[3:])
    assert (args.task, args.module, args.device) == ("t.py", "m.py", "cuda:1")
    assert args.seed == (42 if seed is None else seed)
    assert (args.eval, args.construct_on) == (True, "device")


@pytest.mark.parametrize(("profiler", "function"), [
    ("void foo::bar_kernel<float, 4>(float*, int)", "bar_kernel"),
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
    ("void (anonymous namespace)::softmax_warp<float>(float*)", "softmax_warp"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128", "Kernel2"),
    ("", ""),
])
def test_kernel_function_names_for_ncus_filter(profiler: str, function: str) -> None:
    assert ncu.function_name(profiler) == function


def _summary() -> ProfileSummary:
    return ProfileSummary(calls=3, device="cuda:0", host_ms_per_call=0.2,
                          device_ms_per_call=1.0, kernel_launches_per_call=2,
                          top_kernels=[OpTime(name="void gemm_tile<float>(const float *)",
                                              ms_per_call=0.8, share=0.8, count_per_call=1)])


def test_without_ncu_the_skip_is_one_line_and_nothing_fails(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    ncu._say_missing.cache_clear()
    cfg = EvalConfig(ncu=True)
    with caplog.at_level(logging.INFO):
        assert ncu.kernel_metrics(MLP, FUSED, [], "cuda:0", cfg) is None
        assert ncu.kernel_metrics(MLP, FUSED, [], "cuda:0", cfg) is None
        summary = _summary()
        ncu.attach_kernel_metrics(summary, MLP, FUSED, "cuda:0", cfg)
    assert [r.getMessage() for r in caplog.records] == ["ncu not found: kernel metrics skipped"]
    assert summary.ncu == ncu.MISSING and summary.kernel_metrics == []


def _fake_ncu(folder: Path, body: str) -> None:
    """An `ncu` on PATH: a Python script whose `body` sees `argv`."""
    folder.mkdir()
    script = folder / "ncu"
    script.write_text(f"#!{sys.executable}\nimport sys, time\nargv = sys.argv[1:]\n"
                      + textwrap.dedent(body))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "bin"


def test_metrics_land_on_the_profile_and_in_its_rendering(fake_ncu: Path, tmp_path: Path,
                                                          build_cache: Path) -> None:
    sample = tmp_path / "sample.csv"
    sample.write_text(SAMPLE)
    asked = tmp_path / "asked.txt"
    # The profiled run may be in the OS sandbox, where only its work folder is writable:
    # it writes its command line into the report, which the trusted import run copies out.
    _fake_ncu(fake_ncu, f"""
        if "--import" in argv:
            open({str(asked)!r}, "w").write(open(argv[argv.index("--import") + 1]).read())
            print(open({str(sample)!r}).read())
        else:
            open(argv[argv.index("--export") + 1], "w").write(" ".join(argv))
    """)
    summary = _summary()
    cfg = EvalConfig(ncu=True, build_cache=build_cache)
    ncu.attach_kernel_metrics(summary, MLP, FUSED, "cuda:0", cfg, build_key="k")
    assert [m.launches for m in summary.kernel_metrics] == [2, 1]
    assert summary.ncu == "Nsight Compute: 2 kernels measured"
    target = asked.read_text()
    task, module = ((f"/pike/task/{MLP.name}", f"/pike/module/{FUSED.name}")
                    if _sandboxed() else (MLP.resolve(), FUSED.resolve()))
    assert f"-m pike.evaluate.ncu_target {task} {module} --device cuda:0" in target
    assert "regex:gemm_tile" in target
    text = render(summary, max_tokens=300)
    assert "Nsight Compute, % of peak" in text
    assert "occupancy 45%, DRAM 75%, SM 25%" in text and "DRAM ?" in text
    on_cpu, off = _summary(), _summary()
    ncu.attach_kernel_metrics(on_cpu, MLP, FUSED, "cpu", cfg)  # no GPU: no pass
    ncu.attach_kernel_metrics(off, MLP, FUSED, "cuda:0", EvalConfig(ncu=False))  # not asked
    for plain in (on_cpu, off):
        assert plain.kernel_metrics == [] and plain.ncu == "" and "Nsight" not in render(plain)


def test_an_ncu_error_becomes_the_note_not_a_failure(fake_ncu: Path,
                                                     build_cache: Path) -> None:
    _fake_ncu(fake_ncu, """
        print("==PROF== Connected to process 1")
        print("==ERROR== ERR_NVGPUCTRPERM - no permission to access GPU performance counters")
        sys.exit(1)
    """)
    summary = _summary()
    ncu.attach_kernel_metrics(summary, MLP, FUSED, "cuda:0",
                              EvalConfig(ncu=True, build_cache=build_cache))
    assert summary.kernel_metrics == []
    assert summary.ncu.startswith("ncu wrote no report: ==ERROR== ERR_NVGPUCTRPERM")


def test_a_target_that_fails_under_ncu_is_named_with_its_own_last_line(
        fake_ncu: Path, build_cache: Path) -> None:
    _fake_ncu(fake_ncu, """
        print("==PROF== Connected to process 1")
        print("Traceback (most recent call last):")
        print("RuntimeError: CUDA error: out of memory")
        print("CUDA kernel errors might be asynchronously reported at some other API call")
        print("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
        print("==ERROR== The application returned an error code (1).")
        sys.exit(1)
    """)
    summary = _summary()
    ncu.attach_kernel_metrics(summary, MLP, FUSED, "cuda:0",
                              EvalConfig(ncu=True, build_cache=build_cache))
    assert summary.kernel_metrics == []
    assert summary.ncu == ("ncu wrote no report: ==ERROR== The application returned an error "
                           "code (1).; the target's last line: RuntimeError: CUDA error: out "
                           "of memory")


def test_a_hanging_ncu_is_stopped_at_its_limit_with_nothing_left(fake_ncu: Path,
                                                                  tmp_path: Path,
                                                                  build_cache: Path) -> None:
    # found by its command line: in the OS sandbox its PID is the namespace's own
    marker = f"ncu-escapee-{os.getpid()}-{tmp_path.name}"
    _fake_ncu(fake_ncu, f"""
        import os, subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", {marker!r}],
                         start_new_session=True)  # tries to escape the group
        time.sleep(60)
    """)
    cfg = EvalConfig(ncu=True, build_cache=build_cache,
                     limits=LimitsConfig(load_seconds=4.0, check_seconds=1.0))
    assert ncu.kernel_metrics(MLP, FUSED, [], "cuda:0", cfg) is None

    def escaped() -> list[psutil.Process]:
        alive = []
        for p in psutil.process_iter(["cmdline", "status"]):
            if marker in (p.info["cmdline"] or []) and p.info["status"] != "zombie":
                alive.append(p)
        return alive

    deadline = time.monotonic() + 5  # a namespace's processes end just after its init
    while escaped() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert escaped() == []


def _sandboxed() -> bool:
    return sandbox_problem() is None


@pytest.mark.skipif(not _sandboxed(), reason="the OS sandbox (bubblewrap) cannot run here")
def test_the_profiled_module_runs_in_the_os_sandbox(fake_ncu: Path, tmp_path: Path,
                                                    build_cache: Path) -> None:
    """ncu runs the candidate's module afresh: it gets what a judged child gets, no more."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's key")
    seen = tmp_path / "seen.json"
    _fake_ncu(fake_ncu, f"""
        import json, os
        if "--import" in argv:
            open({str(seen)!r}, "w").write(open(argv[argv.index("--import") + 1]).read())
            sys.exit(1)
        target = argv[argv.index("pike.evaluate.ncu_target") + 1:]

        def refused(action):
            try:
                action()
                return False
            except OSError:
                return True

        found = {{
            "secret_refused": refused(lambda: open({str(secret)!r}).read()),
            "module_read_only": refused(lambda: open(target[1], "a").write("x")),
            "task_readable": not refused(lambda: open(target[0]).read()),
            "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "interfaces": [line.split(":")[0].strip()
                           for line in open("/proc/net/dev").read().splitlines()[2:]],
            "home": os.environ["HOME"],
        }}
        open(argv[argv.index("--export") + 1], "w").write(json.dumps(found))
    """)
    module = tmp_path / "module" / FUSED.name  # a copy: a sandbox that failed would write it
    module.parent.mkdir()
    module.write_text(FUSED.read_text())
    ncu.kernel_metrics(MLP, module, [], "cuda:0", EvalConfig(ncu=True, build_cache=build_cache))
    assert module.read_text() == FUSED.read_text()
    found = json.loads(seen.read_text())
    assert found["secret_refused"] and found["module_read_only"] and found["task_readable"]
    assert found["interfaces"] in ([], ["lo"])  # its own network namespace
    assert max(found["processes"]) < 100  # its own PID namespace: bwrap's init, ncu
    assert found["home"].startswith("/pike/work/")


def test_a_counters_permission_error_in_the_sandbox_says_what_the_driver_needs(
        fake_ncu: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ncu(fake_ncu, """
        print("==ERROR== ERR_NVGPUCTRPERM - no permission to access GPU performance counters")
        sys.exit(1)
    """)
    summary = _summary()
    ncu.attach_kernel_metrics(summary, MLP, FUSED, "cuda:0",
                              EvalConfig(ncu=True, build_cache=build_cache))
    hint = "NVreg_RestrictProfilingToAdminUsers=0"
    assert (hint in summary.ncu) == _sandboxed(), summary.ncu
    plain = _summary()  # no sandbox: nothing about it
    ncu.attach_kernel_metrics(plain, MLP, FUSED, "cuda:0",
                              EvalConfig(ncu=True, build_cache=build_cache, sandbox="off"))
    assert plain.ncu.startswith("ncu wrote no report: ==ERROR== ERR_NVGPUCTRPERM")
    assert hint not in plain.ncu


@pytest.mark.gpu
def test_ncu_measures_the_top_kernels_of_a_candidate(build_cache: Path) -> None:
    if ncu.shutil.which("ncu") is None:
        pytest.skip("ncu is not installed")
    import importlib.util

    spec = importlib.util.spec_from_file_location("fused_for_ncu", FUSED)
    task_spec = importlib.util.spec_from_file_location("mlp_for_ncu", MLP)
    assert spec and spec.loader and task_spec and task_spec.loader
    module, task = (importlib.util.module_from_spec(spec),
                    importlib.util.module_from_spec(task_spec))
    spec.loader.exec_module(module)
    task_spec.loader.exec_module(task)
    model = module.ModelNew(*task.get_init_inputs()).cuda()
    inputs = [x.cuda() for x in task.get_inputs()]
    with torch.no_grad():
        summary = profile_calls(lambda: model(*inputs), torch.device("cuda"), 3)
    assert summary.top_kernels
    cfg = EvalConfig(device="cuda", ncu=True, build_cache=build_cache)
    ncu.attach_kernel_metrics(summary, MLP, FUSED, "cuda:0", cfg, build_key="ncu-gpu-test")
    assert summary.kernel_metrics, summary.ncu
    for metrics in summary.kernel_metrics:
        assert isinstance(metrics, KernelMetrics) and metrics.launches >= 1
        assert metrics.achieved_occupancy_pct is not None
        assert 0 < metrics.achieved_occupancy_pct <= 100
        assert metrics.dram_throughput_pct is not None and metrics.sm_throughput_pct is not None
    assert "Nsight Compute, % of peak" in render(summary, max_tokens=1000)


def test_the_profiled_module_loads_under_the_childs_file_limit_and_filter(
        tmp_path: Path) -> None:
    """ncu's target runs candidate code as a judged child does: its file limit (hard) and,
    where the host has it, the system-call filter are on before the module is imported."""
    from pike.evaluate import syscall_filter

    seen = tmp_path / "seen.txt"
    module = tmp_path / "module.py"
    module.write_text(textwrap.dedent(f"""
        import os, resource
        status = open("/proc/self/status").read()
        filtered = [line for line in status.splitlines() if line.startswith("Seccomp:")]
        open({str(seen)!r}, "w").write(f"{{resource.getrlimit(resource.RLIMIT_FSIZE)}} {{filtered}}")
        os._exit(0)
    """))
    command = ncu.target_command(MLP, module, "cpu", EvalConfig(seed=1))
    limit = int(command[command.index("--file-bytes-limit") + 1])
    assert limit == 8 * 2**30  # no outputs to write: the fixed part of the disk limit
    command[command.index("--file-bytes-limit") + 1] = str(2**20)
    done = subprocess.run(command, timeout=120, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said = seen.read_text()
    assert said.startswith(f"({2**20}, {2**20})"), said
    if not syscall_filter.unsupported():
        assert "Seccomp:\\t2" in said, said  # mode 2: a filter
