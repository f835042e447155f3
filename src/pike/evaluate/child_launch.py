"""Starting a child from the parent: its sandbox, its view of paths and GPU, its build
folder, its phase limits, and its room on the host before it begins.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from pike.config import EvalConfig
from pike.evaluate import device_lock, host_memory, task_size
from pike.evaluate.child_environment import child_environment, make_child_dirs
from pike.evaluate.cores import start_on_build_cores
from pike.evaluate.held_files import in_memory
from pike.evaluate.leftovers import scratch_root
from pike.evaluate.network_namespace import network_prefix
from pike.evaluate.os_sandbox import INSIDE_ROOT, Mount, SandboxPlan, sandbox_active
from pike.evaluate.protocol import ChildRequest, Role
from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.staging import InputStage
from pike.evaluate.steps import current as step_clock
from pike.evaluate.steps import span

log = logging.getLogger(__name__)


def start_child(request: ChildRequest, work_dir: Path, cfg: EvalConfig,
                build_key: str, stage: InputStage | None = None,
                run_limit_s: float | None = None) -> ChildProcess:
    """Start a sandboxed child and hand it its request at once; the caller must `finish`
    it. `launch_child` and `begin_child` do the same in two steps."""
    child = launch_child(request, work_dir, cfg, build_key, stage)
    begin_child(child, cfg, run_limit_s)
    return child


def launch_child(request: ChildRequest, work_dir: Path, cfg: EvalConfig,
                 build_key: str, stage: InputStage | None = None) -> ChildProcess:
    """Start a sandboxed child that imports what it needs and waits: no candidate code
    runs and no device is touched before `begin_child`, so this needs no device hold (a
    reference's child may be asked its task's size on the meta device meanwhile,
    `wait_for_room`).
    The caller must `finish` it (or call its __exit__).

    `request` names host paths; the child gets them as it sees them (under /pike/ in the
    OS sandbox). Its fields other than paths may still change until `begin_child`.
    A candidate's inputs come through `stage`, phase by phase."""
    cache_root = build_cache_root(cfg, request.role)
    make_child_dirs(work_dir)
    plan = _sandbox_plan(request, work_dir, cache_root, cfg)
    see = plan.inside if plan is not None else os.path.realpath
    folders = [work_dir, Path(request.outputs_dir)]  # on the host: what disk_use reads
    request.module_path = see(request.module_path)
    request.inputs_dir, request.outputs_dir = see(request.inputs_dir), see(request.outputs_dir)
    if request.extensions_dir:
        request.extensions_dir = see(request.extensions_dir)
    request.writable = [see(work_dir), see(cache_root)]
    if plan is not None:
        request.writable.append("/dev/shm")  # the sandbox's own, private one
    env = child_environment(see(work_dir), uuid.uuid4().hex, see(cache_root / build_key),
                            see(cache_root), cfg.compile_threads)
    device = request.device  # as this process numbers GPUs; the child sees only its own
    _only_one_gpu(request, env)
    prefix = plan.prefix() if plan is not None else network_prefix(cfg.network_isolation)
    child = ChildProcess(request, work_dir, env, cfg.limits, _phase_limits(cfg, None),
                         prefix=prefix, sandboxed=plan is not None, stage=stage)
    child.see, child.folders = see, folders
    if plan is not None:
        child.plan_notes = plan.describe()
    child.__enter__()
    if child.proc is not None:
        start_on_build_cores(child.proc.pid, device, cfg.timing_cores)
    return child


def build_cache_root(cfg: EvalConfig, role: Role = "candidate") -> Path:
    """The build folder (compiled extensions, inductor's and Triton's caches) of children
    of `role`. Candidates share one. The reference has its own, which no candidate can
    reach: its compile modes are the baselines every figure is compared with, and what a
    cache holds (a compiled graph's Python, a kernel's binary, a precompiled header) is
    code the process that finds it there runs. The reference's sits beside the configured
    folder, not in it: a pike from before the split gives its candidates that whole
    folder."""
    base = cfg.build_cache or Path.home() / ".cache" / "pike" / "build"
    root = (base.with_name(f"{base.name}-reference") if role == "reference"
            else base / "candidates")
    root.mkdir(parents=True, exist_ok=True)
    return root


def begin_child(child: ChildProcess, cfg: EvalConfig, run_limit_s: float | None = None) -> None:
    """Hand a launched child its request: it loads, builds and runs from here (hold the
    device first where it has one). `run_limit_s` tightens the check and timing limits
    (the config's stay ceilings). A child not yet given its room on the host
    (`wait_for_room`) waits for it here."""
    wait_for_room(child)
    child.phase_limits = _phase_limits(cfg, run_limit_s)
    child.begin()


def wait_for_room(child: ChildProcess, limit_s: float | None = None) -> None:
    """Wait until the host's memory has room for the child to begin (host_memory), at
    most `limit_s` (0: count it at once, for a caller that holds the device or a lock
    others need); call it before any device hold, since timers would wait behind the
    hold meanwhile. The wait is the step `wait_for_memory`. A new task's reference is
    first asked its task's size (task_size), which the gate expects it at."""
    task = child.request.task_sha256 or child.request.module_path
    if child.request.role == "reference" and limit_s != 0 and not host_memory.HOST.begun(
            child) and host_memory.HOST.wants_size(task):
        host_memory.HOST.sized(task, _structural_size(child))
    waited = host_memory.HOST.admit(child, task, child.request.role, limit_s)
    if waited:
        step_clock().add("wait_for_memory", waited)


def _structural_size(child: ChildProcess) -> int | None:
    """What the reference's child holds of its task's own bytes (task_size), from its
    answer to "size"; None where it gave none, said why in the log."""
    with span("ask_size"):
        answer = child.ask_size(task_size.SIZE_SECONDS + _ASK_SLACK_S)
    req = child.request
    size = None if answer is None else task_size.structural_for(
        answer, req.trials, req.timing.input_sets, in_memory(scratch_root()),
        req.device == "cpu")
    if size is None:
        log.info("%s: no size on the meta device (%s); the host-memory gate expects it at "
                 "the largest size measured", Path(req.module_path).name,
                 "no answer" if answer is None else answer.get("error", "malformed"))
    return size


# the child may still be importing torch when asked (it is started ahead of its request)
_ASK_SLACK_S = 30.0


def list_for_timers(child: ChildProcess, device: str, scope: str) -> None:
    """From now until `finish`, other evaluations' timers stop this child for their
    windows, where `eval.device_lock` is pause_others (device_lock.list_child); call it
    before the child begins, so no candidate code runs unlisted."""
    if child.proc is not None and device_lock.list_child(device, child.proc.pid, scope):
        child.pausable_on = device


def _phase_limits(cfg: EvalConfig, run_limit_s: float | None) -> dict[str, float]:
    lim = cfg.limits
    check_s, timing_s = lim.check_seconds, lim.timing_seconds
    if run_limit_s is not None:
        check_s, timing_s = min(check_s, run_limit_s), min(timing_s, run_limit_s)
    return {"setup": lim.load_seconds, "load": lim.load_seconds,
            "init": lim.load_seconds, "check": check_s,
            "timing": timing_s, "build": lim.build_seconds, "cleanup": 10.0,
            # advisory passes: a hang here must not hold the device for long
            "profile": lim.check_seconds, "work": lim.check_seconds,
            # one trial in float64 (own_rounding): slower than the check's trials in float32
            "exact": 2 * lim.check_seconds,
            # the timed sets' outputs again (ReferenceRun.timed_answers): as many forwards
            # as the check ran, at most
            "timed_values": lim.check_seconds}


def _sandbox_plan(request: ChildRequest, work_dir: Path, cache_root: Path,
                  cfg: EvalConfig) -> SandboxPlan | None:
    """What the child sees in the OS sandbox: its own folders under /pike/ and, for the
    reference, the task file; None where the sandbox is off or unavailable."""
    if not sandbox_active(cfg.sandbox):
        return None
    module = Path(request.module_path)
    mounts = [Mount(work_dir, f"{INSIDE_ROOT}/work", writable=True),
              Mount(Path(request.outputs_dir), f"{INSIDE_ROOT}/outputs", writable=True),
              Mount(Path(request.inputs_dir), f"{INSIDE_ROOT}/inputs",
                    writable=request.role == "reference"),
              Mount(cache_root, f"{INSIDE_ROOT}/cache", writable=True)]
    if not module.resolve().is_relative_to(work_dir.resolve()):
        mounts.append(Mount(module, f"{INSIDE_ROOT}/task/{module.name}"))
    return SandboxPlan(mounts, share_network=cfg.network_isolation == "off")


def _only_one_gpu(request: ChildRequest, env: dict[str, str]) -> None:
    """The child sees only its own GPU, so no work can hide on another device."""
    if not request.device.startswith("cuda"):
        return
    env["CUDA_VISIBLE_DEVICES"] = device_lock.physical_gpu(request.device)
    request.device = "cuda:0"
