"""Nsight Compute metrics of a module's top kernels (EvalConfig.ncu): achieved occupancy,
DRAM and SM throughput, where `ncu` is installed; one logged line where it is not.

ncu replays every profiled kernel several times to read the GPU's counters, so it cannot
run inside the judged child: it starts the module afresh in a process of its own
(pike.evaluate.ncu_target) with the child's protections (scrubbed environment, the OS
sandbox where the children have it, else a network namespace; its disk limit and
system-call filter; a wall-clock limit, the whole process tree killed at the end) and writes a report, which a second, trusted ncu
run prints as CSV. Like the profile, the metrics only inform prompts and users: any
failure here is a note on the summary, never a verdict.

Inside the OS sandbox ncu runs as root of a user namespace, not of the host: where the
driver keeps the GPU's counters to admin users (NVreg_RestrictProfilingToAdminUsers=1,
its default), ncu there reads none and the note says so. The module is candidate code;
it does not leave the sandbox for a few advisory metrics.
"""

from __future__ import annotations

import csv
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

from pike.config import EvalConfig
from pike.evaluate.child_environment import child_environment, make_child_dirs
from pike.evaluate.child_launch import build_cache_root
from pike.evaluate.child_start import SPAWNER, child_setup
from pike.evaluate.disk_use import disk_limit_bytes
from pike.evaluate.leftovers import make_temp_dir, remove_tree
from pike.evaluate.ncu_target import NVTX_RANGE
from pike.evaluate.network_namespace import network_prefix
from pike.evaluate.oom_killer import child_oom_score
from pike.evaluate.os_sandbox import INSIDE_ROOT, Mount, SandboxPlan, sandbox_active
from pike.evaluate.profile import KernelMetrics, ProfileSummary
from pike.evaluate.sandbox import _kill_each, _marked_processes

log = logging.getLogger(__name__)

MISSING = "ncu not found: kernel metrics skipped"
# ncu's metric -> our field
METRICS = {
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
}
_MAX_LAUNCHES = 40  # kernels profiled at most; each costs a replay per counter pass
_CALLS = 2  # forward calls inside the profiled range
_IMPORT_SECONDS = 60.0


class NcuUnavailable(Exception):
    """Why there are no metrics: one line for the log and the summary's note."""


def kernel_metrics(task_path: Path, module_path: Path, kernel_names: list[str], device: str,
                   cfg: EvalConfig, build_key: str = "ncu") -> list[KernelMetrics] | None:
    """The metrics of the kernels named (the profile's top kernels; none: any kernel) that
    `module_path` launches on `device`, or None (logged) when ncu is missing or failed."""
    try:
        return measure(task_path, module_path, kernel_names, device, cfg, build_key)
    except NcuUnavailable as why:
        if str(why) != MISSING:  # that one was said once already
            log.warning("%s", why)
        return None


def attach_kernel_metrics(summary: ProfileSummary | None, task_path: Path, module_path: Path,
                          device: str, cfg: EvalConfig, build_key: str = "ncu") -> None:
    """With cfg.ncu on a CUDA device, put the metrics of the summary's top kernels on it,
    or in its `ncu` note why there are none. Never raises: the evaluation goes on."""
    if summary is None or not cfg.ncu or not device.startswith("cuda"):
        return
    names = [k.name for k in summary.top_kernels]
    try:
        summary.kernel_metrics = measure(task_path, module_path, names, device, cfg, build_key)
        summary.ncu = f"Nsight Compute: {len(summary.kernel_metrics)} kernels measured"
    except NcuUnavailable as why:
        summary.ncu = str(why)
    except Exception as err:  # advisory: nothing here may end an evaluation
        log.warning("Nsight Compute pass failed: %s", err)
        summary.ncu = f"Nsight Compute pass failed: {type(err).__name__}: {err}"[:300]


def measure(task_path: Path, module_path: Path, kernel_names: list[str], device: str,
            cfg: EvalConfig, build_key: str = "ncu") -> list[KernelMetrics]:
    """Run ncu on the module and read its report; NcuUnavailable says why not."""
    ncu = shutil.which("ncu")
    if ncu is None:
        _say_missing()
        raise NcuUnavailable(MISSING)
    if not device.startswith("cuda"):
        raise NcuUnavailable("no GPU: Nsight Compute does not apply")
    work = make_temp_dir("ncu")
    try:
        report = work / "kernels.ncu-rep"
        cache_root = build_cache_root(cfg)
        plan = _sandbox_plan(ncu, task_path, module_path, work, cache_root, cfg)
        see = plan.inside if plan is not None else os.path.realpath
        prefix = plan.prefix() if plan is not None else network_prefix(cfg.network_isolation)
        target = target_command(Path(see(task_path)), Path(see(module_path)), device, cfg)
        command = [*prefix, *ncu_command(see(ncu), target, kernel_names, Path(see(report)))]
        env = child_environment(see(work), uuid.uuid4().hex, see(cache_root / build_key),
                                see(cache_root))
        limit = cfg.limits.load_seconds + cfg.limits.check_seconds
        _run_isolated(command, work, env, limit)
        if not report.is_file():
            said = _error_line(work / "ncu.log")
            if plan is not None and "ERR_NVGPUCTRPERM" in said:
                said += (" (ncu ran in the OS sandbox, where the host's root is not root: "
                         "the driver must open the counters to every user, "
                         "NVreg_RestrictProfilingToAdminUsers=0)")
            raise NcuUnavailable(f"ncu wrote no report: {said}")
        printed = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "details"],
                                 capture_output=True, text=True, timeout=_IMPORT_SECONDS)
        if printed.returncode != 0:
            raise NcuUnavailable(f"ncu could not read its report: {printed.stderr.strip()[:200]}")
        found = parse_csv(printed.stdout)
        if not found:  # e.g. no permission to read the counters: ncu says so in its log
            raise NcuUnavailable(f"ncu measured no kernel: {_error_line(work / 'ncu.log')}")
        return found
    finally:
        remove_tree(work)  # the module's code wrote in it


def target_command(task_path: Path, module_path: Path, device: str,
                   cfg: EvalConfig) -> list[str]:
    """The program ncu profiles. Its inputs need no secret seed (it runs after the verdict,
    on its own inputs): without a configured seed it takes its own default."""
    return [sys.executable, "-m", "pike.evaluate.ncu_target", str(task_path), str(module_path),
            "--device", device, "--calls", str(_CALLS),
            *(["--seed", str(cfg.seed)] if cfg.seed is not None else []),
            "--construct-on", cfg.construct_on,
            # it writes no outputs: a judged child's disk limit without them
            # (8 GiB, or eval.limits.disk_gib where set)
            "--file-bytes-limit", str(disk_limit_bytes(cfg.limits, 0, 0)),
            *(["--eval"] if cfg.model_mode == "eval" else [])]


def ncu_command(ncu: str, target: list[str], kernel_names: list[str], report: Path) -> list[str]:
    """ncu's command line: our three metrics, only inside the target's NVTX range, only the
    kernels named (matched by their function names), at most _MAX_LAUNCHES launches."""
    command = [ncu, "--metrics", ",".join(METRICS), "--nvtx", "--nvtx-include",
               f"{NVTX_RANGE}/", "--launch-count", str(_MAX_LAUNCHES),
               "--export", str(report), "--force-overwrite"]
    functions = sorted({f for f in map(function_name, kernel_names) if f})
    if functions:
        command += ["--kernel-name", "regex:" + "|".join(functions)]
    return command + target


def function_name(kernel: str) -> str:
    """The bare function name of a kernel as torch.profiler names it, which ncu matches
    against its own: 'void at::native::(anonymous namespace)::foo_kernel<4, float>(int)'
    -> 'foo_kernel'. Only word characters, so it is safe in ncu's regex."""
    head = re.split(r"[<(]", kernel.replace("(anonymous namespace)", ""), maxsplit=1)[0]
    words = head.split()
    last = words[-1].split("::")[-1] if words else ""
    return last if re.fullmatch(r"\w+", last) else ""


def parse_csv(text: str) -> list[KernelMetrics]:
    """Per-kernel means from ncu's `--csv --page details` output: one row per launch (ID)
    and metric. Lines before the header (ncu's ==PROF== notes) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    launches: dict[str, tuple[str, dict[str, float]]] = {}
    for row in csv.DictReader(lines[start:]):
        field = METRICS.get(row.get("Metric Name") or "")
        if field is None:
            continue
        name, values = launches.setdefault(row["ID"], (row.get("Kernel Name") or "?", {}))
        value = _number(row.get("Metric Value") or "")
        if value is not None:
            values[field] = value
    by_kernel: dict[str, list[dict[str, float]]] = {}
    for name, values in launches.values():
        by_kernel.setdefault(name, []).append(values)
    return [KernelMetrics(name=name, launches=len(runs), **{
                field: _mean([r[field] for r in runs if field in r]) for field in METRICS.values()})
            for name, runs in by_kernel.items()]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))  # ncu groups thousands: "1,024.50"
    except ValueError:
        return None  # "n/a" where a counter is not available


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _sandbox_plan(ncu: str, task_path: Path, module_path: Path, work: Path,
                  cache_root: Path, cfg: EvalConfig) -> SandboxPlan | None:
    """What ncu and its target see in the OS sandbox, as a judged child does: the work
    folder (where the report is written) and the candidates' build cache writable, the
    task and the module read-only, and ncu's own installation where it is; None where the
    sandbox is off or unavailable."""
    if not sandbox_active(cfg.sandbox):
        return None
    installed = Path(os.path.realpath(ncu)).parent  # ncu finds its host/ and target/ there
    return SandboxPlan([Mount(work, f"{INSIDE_ROOT}/work", writable=True),
                        Mount(cache_root, f"{INSIDE_ROOT}/cache", writable=True),
                        Mount(task_path, f"{INSIDE_ROOT}/task/{task_path.name}"),
                        Mount(module_path, f"{INSIDE_ROOT}/module/{module_path.name}"),
                        Mount(installed, f"{INSIDE_ROOT}/ncu")],
                       share_network=cfg.network_isolation == "off")


def _run_isolated(command: list[str], work: Path, env: dict[str, str], limit_s: float) -> None:
    """Run the untrusted target under ncu as the judged child runs: no secrets in its
    environment (`env`), its own home and temp dir, the shared build cache, a wall-clock
    limit, and nothing left running afterwards."""
    make_child_dirs(work)
    with open(work / "ncu.log", "wb") as out:
        # The candidate's code runs in it: started as a candidate's child is (first for
        # the out-of-memory killer, ended with pike), from the spawning thread, whose life
        # the death signal follows.
        proc = SPAWNER.run(functools.partial(
            subprocess.Popen, command, cwd=work, env=env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=child_setup(os.getpid(), child_oom_score("candidate"))))
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            raise NcuUnavailable(f"ncu ran past its limit of {limit_s:.0f} s") from None
        finally:
            _kill_tree(proc, env)


def _kill_tree(proc: subprocess.Popen[bytes], env: dict[str, str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    escaped = _marked_processes(env)  # those that left the process group
    _kill_each(escaped)
    psutil.wait_procs(escaped, timeout=5)  # a kill is delivered, not done, when sent
    proc.wait()


def _error_line(log_path: Path) -> str:
    """The line of ncu's output that says what went wrong (==ERROR==, else the last)."""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return "no output"
    errors = [line for line in lines if "==ERROR==" in line]
    said = ((errors or lines or ["no output"])[-1])[:200]
    # ncu only says the target's exit code; the target's own words say why: its exception
    # (torch ends a CUDA error with hints about debugging), else its last line
    own = [line for line in lines if not line.startswith("==")]
    if errors and "returned an error code" in said and own:
        raised = [line for line in own if _EXCEPTION.match(line)]
        said += f"; the target's last line: {(raised or own)[-1][:200]}"
    return said


_EXCEPTION = re.compile(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b.*")


@functools.cache
def _say_missing() -> None:
    # Once per process: a search judges hundreds of candidates, the log needs it once.
    log.warning(MISSING)
