"""Candidates that cheat, crash or attack: each must get the verdict that names it."""

from __future__ import annotations

import math
import os
import socket
import sys
from pathlib import Path

import pytest

from pike.config import EvalConfig
from pike.evaluate import evaluate
from pike.evaluate.guards import Guards
from pike.task import Task
from tests.conftest import candidate, clock_rule_spy

# reused answers are told by their speed: beside another test process the margin goes
pytestmark = pytest.mark.timing


@pytest.mark.parametrize(("name", "status", "words"), [
    ("caches_by_pointer", "incorrect", ""),
    ("counts_calls", "incorrect", "timed call"),  # caught by the timed outputs first
    ("assumes_randn", "incorrect", "another distribution"),  # drawn: at least 2.5x randn's
    ("patches_event", "rejected", "patching torch.cuda.Event.elapsed_time"),
    ("patches_evaluator", "rejected", "pike.evaluate.timing._perf_counter"),
    ("walks_gc", "rejected", "gc.get_objects"),
    ("tensor_subclass", "rejected", "tensor subclass"),
    ("thread_outlives", "rejected", "thread"),
    ("pool_outlives", "rejected", "thread"),  # a thread pool's worker: stdlib target
    ("pool_outlives_builtin", "rejected", "thread"),  # and no frame of its own code
    ("forges_messages", "rejected", "forged message"),
    # round 2: timed calls told apart from checked ones, answers reused, library patches
    ("stale_by_frames", "incorrect", "timed call"),
    ("memo_by_values", "rejected", "reused, not computed"),
    ("memo_by_version", "incorrect", ""),
    ("stale_when_fast", "incorrect", ""),
    ("mock_patches_tensor", "rejected", "patching torch.Tensor"),
    # round 3: code passed off as a library's by its file name or its folder's name
    ("names_code_as_library", "rejected", "library's file"),
    ("helper_in_torch_folder", "rejected", "thread"),
    # round 4: the name given by a standard library helper, or by no call at all
    ("compiles_through_stdlib", "rejected", "library's file"),
    ("marshals_code", "rejected", "marshal data"),
    # round 5: the name given by importlib's own (frozen) code, with bytes the candidate chose
    ("loader_names_code_as_library", "rejected", "library's file"),
    ("unmarshals_through_importlib", "rejected", "marshal data"),
    # round 6: the probe sets read ahead from the evaluator's memory (each was `ok` at about
    # 70x on the CPU before the probes were sealed, but pulls_probes_ahead, which finds no
    # seal to pull from there and is told by its reused answers)
    ("reads_probes_by_frames", "rejected", "inspecting the evaluator's frames"),
    ("pulls_probes_ahead", "rejected", "probe sets out of turn"),
    ("reenters_the_rotation", "rejected", "inspecting the evaluator's frames"),
    ("disarms_the_guards", "rejected", "inspecting the evaluator's frames"),
    ("empties_the_guards_lists", "rejected", "patching pike.evaluate.guards._untrusted_dirs"),
    # round 7 (helper-46's review of round 6): each `ok` at 67 to 73x on the CPU before
    ("starves_probes", "rejected", "probes were withheld"),
    ("reads_inside_the_hook", "runtime_error", "ran none of the bait's code"),
    ("replaces_audit", "rejected", "inspecting the evaluator's frames"),
    ("patches_guards_class", "rejected", ""),
    ("truthy_enabled", "rejected", "reused, not computed"),
    ("pulls_by_thread", "rejected", "probe sets out of turn"),
    ("swaps_getframe", "rejected", "inspecting the evaluator's frames"),
    ("reads_other_threads_frames", "rejected", "every thread's frames"),
    ("leaves_a_timer", "rejected", "a thread that outlives the call"),
    ("shadows_taker", "rejected", "probe sets out of turn"),
    # names a memo hit as its probe with the probes starved: `ok` at 150x on the CPU before
    ("claims_probes", "rejected", "no sample of those inputs' outputs"),
    # the rotation's class patched through its module: `ok` before, the patch unseen (no
    # audit event for a class attribute set, and the classes were looked for under the
    # runner's name, which a child runs as __main__)
    ("patches_rotation_class", "rejected", "patching pike.evaluate.timed_calls.InputRotation"),
    ("patches_channel_class", "rejected", "patching pike.evaluate.protocol.Channel"),
    # round 8 (helper-58): work deferred past the timed call by a lazy output (`ok` at 4x
    # to 6x on the CPU before), and a memo whose times are shaped to pass the reuse check
    # (`ok` at 8x before it weighed the probes against the median)
    ("lazy_when_timed", "rejected", "from a timed call"),
    # stretches its first window's blocks (a sleep in each block's untimed first call) so
    # the window is timed again without probes: `ok` at 66x to 83x on the CPU before
    ("memo_stretches_its_blocks", "rejected", "reused, not computed"),
    ("iterates_lazily", "rejected", "from a timed call"),
    # round 9 (helper-59): a torch function mode left in force, which sees the sampler's
    # reads (`ok` at 42x), and a metaclass that lies to the container check (`ok` at 174x)
    ("leaves_a_mode", "rejected", "in force"),
    ("lies_by_metaclass", "rejected", "_Deferred"),
    ("replaces_a_kernel", "rejected", "aten::index.Tensor"),
    # an output of 2^32 parts from 32 shared lists: ran to the phase's limit before
    ("shares_its_lists", "rejected", "over 10,000 parts"),
    # 700 sleeping processes from a shell: held the host until the phase's limit before
    ("starts_many_processes", "rejected", "over the limit of"),
    # round 10 (helper-60): code the interpreter calls back inside the probes' seal read
    # the probe sets (`ok` at 114x to 1,891x on the CPU), and a kernel for an operator the
    # sampler runs inside another saw the sampled coordinates (`ok` at 35x)
    ("profiles_the_seal", "rejected", "sys.setprofile"),
    ("profiles_by_finalizer", "rejected", "sys.setprofile"),
    ("hooks_the_audit", "rejected", "sys.addaudithook"),
    ("calls_back_from_gc", "rejected", "garbage collector"),
    ("calls_back_by_signal", "rejected", "SIGALRM"),
    ("replaces_a_nested_kernel", "rejected", "aten::detach_"),
    # round 11 (helper-61): the sealed probes read through ctypes (`ok` at 1,768x) or from
    # a weakref callback their release ran inside the seal (2,089x), and a kernel for an
    # operator staging runs saw every input set as it loaded (214x)
    ("reads_the_seal_by_ctypes", "rejected", "reading the process's memory"),
    ("reads_the_seal_on_free", "rejected", "reused, not computed"),
    ("slices_the_staging", "rejected", "aten::slice.Tensor"),
    # a kernel for an operator and key watched nowhere else: seen before the staging
    ("adds_an_unwatched_kernel", "rejected", "aten::sin (for AutogradCPU)"),
])
def test_cheats_get_the_verdict_that_names_them(mlp_task: Task, fast_config: EvalConfig,
                                                name: str, status: str, words: str) -> None:
    verdict = evaluate(mlp_task, candidate(name), fast_config)
    if name == "stale_by_frames" and verdict.status == "rejected":
        # its never-computed buffer (torch.empty) often reuses the block that held the
        # right answer, so the sampled values may match; the parent's clock then names it
        status, words = "rejected", "do not account for the wall time"
    if name == "memo_stretches_its_blocks" and "in each of 3 timing windows" in (
            verdict.message or ""):
        # its stretched blocks may stay unaccounted for in every window on a busy host
        # (a CI run): rejected for that, before its probes are weighed
        words = "do not account for the wall time"
    assert verdict.status == status, verdict.message
    assert words in verdict.message
    assert verdict.runtime is None and verdict.speedup is None


@pytest.mark.parametrize(("name", "words"), [
    ("rewrites_samples", "do not account for the wall time"),  # the parent's clock
    ("zeroes_samples", "which no call takes"),  # refused as the samples arrive
])
def test_rewriting_the_timers_samples_is_caught(
        mlp_task: Task, fast_config: EvalConfig, name: str, words: str) -> None:
    fast_config.timing.min_seconds = 0.5
    # at least 5 calls a block, however loaded the host: it rewrites the samples of the
    # calls before its own, so a block of one call has nothing to forge
    fast_config.timing.min_calls = 100
    verdict = evaluate(mlp_task, candidate(name), fast_config)
    assert verdict.status == "rejected", verdict.message
    assert words in verdict.message
    assert verdict.runtime is None and verdict.speedup is None


def test_under_reporting_below_the_margin_is_held_to_the_parents_clock(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import judge
    seen = clock_rule_spy(monkeypatch, judge)  # (its stretch, the reference's, the factor)
    fast_config.timing.min_seconds = 0.5
    fast_config.timing.min_calls = 100
    forger = evaluate(mlp_task, candidate("under_reports"), fast_config)
    if forger.status == "rejected":  # a loaded host can push its blocks past the margin
        assert "do not account for the wall time" in forger.message
        return
    assert forger.ok, forger.message
    # It claims 1/0.6 = 1.67x its true speed; alone on this host its raised figure came
    # within 1.1x of the honest twin's (tests/candidates/fused.py). How much it is raised
    # rests on the load: the reference's own stretch in the window is its allowance, and
    # in clean-clone CIs it was raised 1.06x, and once not at all. So what is asserted is
    # what holds under any load: the parent's clock sees its blocks stretch past the
    # reference's, and its figure is the one the rule gives (the arithmetic is the next
    # test's). Its speedup is not compared with the twin's: on a loaded 2-core host
    # single CPU figures vary 4x.
    assert seen, "the clock check never ran on its window"
    stretch, reference_stretch, factor = seen[-1]
    assert stretch > reference_stretch, seen
    assert forger.wall_clock_factor == (round(factor, 4) if factor > 1.0 else None), seen
    assert forger.runtime is not None and forger.speedup is not None
    if factor > 1.0:
        assert "raised" in forger.guards["wall clock"]


def test_the_wall_clock_factor_raises_only_what_the_clock_cannot_account_for() -> None:
    from pike.evaluate.timing_window import Timer
    from pike.evaluate.wall_clock_check import FIGURE_TOLERANCE, LoopCost, wall_clock_factor

    cost = LoopCost(per_block_s=0.0, per_call_s=0.0)

    def timer(wall_s: float, reported_ms: float) -> Timer:  # 4 blocks of 9 calls
        samples = [reported_ms / 10] * 9  # with the untimed first call: 10 calls' worth
        return Timer(child=None, mode="candidate",  # type: ignore[arg-type]
                     blocks=[(wall_s + 0.005, samples)] * 4)  # + the scheduling slack

    reference = timer(0.010, 10.0)  # stretch 1.0
    assert wall_clock_factor(cost, timer(0.011, 10.0), reference) == 1.0  # honest: 1.1
    claimed = timer(0.020, 10.0)  # reports half of its 20 ms
    assert wall_clock_factor(cost, claimed, reference) == pytest.approx(2.0 / FIGURE_TOLERANCE)
    # a host that stretches the reference as much stretches the allowance with it
    assert wall_clock_factor(cost, claimed, timer(0.020, 10.0)) == 1.0
    # a reference that runs under its own report allows no less than stretch 1
    assert wall_clock_factor(cost, timer(0.012, 10.0), timer(0.008, 10.0)) == 1.0


def test_forged_samples_behind_honest_block_sums_are_held_to_the_clock() -> None:
    """rewrites_samples under load, as it got `ok` at 629,229x on a CPU host: blocks of two
    and three calls, every sample but each block's last rewritten to a microsecond, so the
    blocks' sums stay near the truth (few blocks over the margin) while most samples, and
    so the median the figure is taken from, are forged."""
    from pike.evaluate.timing_window import Timer
    from pike.evaluate.wall_clock_check import (
        MEDIAN_TOLERANCE,
        LoopCost,
        unaccounted_wall_time,
        wall_clock_factor,
    )

    cost = LoopCost(per_block_s=0.0, per_call_s=0.0)
    true_ms, forged_ms, slack = 10.0, 1e-6, 0.005

    def block(calls: int, samples: list[float]) -> tuple[float, list[float]]:
        return (calls + 1) * true_ms / 1e3 + slack, samples  # + the untimed first call

    forger = Timer(child=None, mode="candidate", blocks=(  # type: ignore[arg-type]
        [block(3, [forged_ms, forged_ms, true_ms])] * 9 + [block(2, [forged_ms, true_ms])] * 11))
    reference = Timer(child=None, mode="eager", blocks=(  # type: ignore[arg-type]
        [block(3, [true_ms] * 3)] * 20))
    assert unaccounted_wall_time(cost, forger, reference) is None  # 9 of 20 over the margin
    raised = wall_clock_factor(cost, forger, reference)
    median = sorted(x for _, samples in forger.blocks for x in samples)[len(
        [x for _, samples in forger.blocks for x in samples]) // 2]
    assert median == forged_ms  # what the figure would have been taken from
    # held to the clock: no faster than the true time over the tolerance
    assert median * raised == pytest.approx(true_ms / MEDIAN_TOLERANCE)
    honest = Timer(child=None, mode="candidate", blocks=(  # type: ignore[arg-type]
        [block(3, [true_ms] * 3)] * 20))
    assert wall_clock_factor(cost, honest, reference) == 1.0


class _Replying:
    """A child's side of the channel that answers each timing request with the next block's
    samples (echoing the request's id, as the real child does)."""

    def __init__(self, blocks: list[list[float]]) -> None:
        self.blocks, self.line_ready_at, self.seq = iter(blocks), 0.0, ""
        self.timed_calls = self.probes_timed = 0  # as ChildProcess counts them

    def enter_phase(self, phase: str) -> None:
        pass

    def send(self, event: str, seq: str = "", **fields: object) -> None:
        self.seq = seq

    def receive(self) -> dict:
        return {"event": "timed", "seq": self.seq, "samples": next(self.blocks)}


def test_zero_samples_are_refused_as_forged_where_they_arrive() -> None:
    """zeroes_samples: every sample of a block but its last rewritten to 0 ms. With more
    than half of all samples 0 and fewer than half of the blocks over the margin, the
    median was 0: wall_clock_factor returned inf and the raised samples became nan."""
    from pike.config import TimingConfig
    from pike.evaluate.timing_window import Timer, time_interleaved
    from pike.evaluate.wall_clock_check import LoopCost, wall_clock_factor

    true_ms = 10.0
    forged = [[0.0, 0.0, true_ms]] * 9 + [[0.0, true_ms]] * 11  # 29 of 49 samples are 0
    honest = [[true_ms] * 3] * 20
    timing = TimingConfig(rounds=20, min_calls=20, min_seconds=0.0)
    timers = [Timer(_Replying(honest), "eager", warmed=True),  # type: ignore[arg-type]
              Timer(_Replying(forged), "candidate", warmed=True)]  # type: ignore[arg-type]
    time_interleaved(timers, timing)
    reference, candidate = timers
    assert candidate.failure is not None and candidate.failure.status == "rejected"
    assert "0.0 ms, which no call takes" in candidate.failure.message
    assert candidate.samples == []  # nothing of the forged block is kept
    assert reference.failure is None and len(reference.samples) == 3  # the window stopped
    # nan, inf, a subnormal (its median would still divide to inf) and an integer too
    # large for a float (it raised in the parent) are no time either
    for bad in (math.nan, math.inf, -1.0, 5e-324, 10**400, "1.0"):
        timer = Timer(_Replying([[true_ms, bad]]), "candidate",  # type: ignore[arg-type]
                      warmed=True)
        time_interleaved([timer], TimingConfig(rounds=1, min_seconds=0.0))
        assert timer.failure is not None and timer.failure.status == "rejected", bad
    # the reference's modes run trusted code: a 0 there is a reading, not a forgery
    trusted = Timer(_Replying([[true_ms, 0.0]]), "eager", warmed=True)  # type: ignore[arg-type]
    time_interleaved([trusted], TimingConfig(rounds=1, min_seconds=0.0))
    assert trusted.failure is None and trusted.samples == [true_ms, 0.0]

    # and had such samples reached the clock's bounds, no factor would come out inf or nan
    cost = LoopCost(per_block_s=0.0, per_call_s=0.0)
    walls = [(len(s) + 1) * true_ms / 1e3 + 0.005 for s in forged]
    judged = Timer(child=None, mode="candidate",  # type: ignore[arg-type]
                   blocks=list(zip(walls, forged, strict=True)))
    zero_reference = Timer(child=None, mode="eager",  # type: ignore[arg-type]
                           blocks=list(zip(walls, forged, strict=True)))
    for ref in (Timer(child=None, mode="eager",  # type: ignore[arg-type]
                      blocks=[(0.045, samples) for samples in honest]), zero_reference):
        factor = wall_clock_factor(cost, judged, ref)
        assert math.isfinite(factor) and factor >= 1.0


def test_a_burst_of_load_on_the_candidates_blocks_alone_is_timed_again(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a busy 2-core host a burst can stretch the candidate's blocks and not the
    # reference's: the first window looks forged, the second does not.
    from pike.evaluate import candidate_windows
    real, calls = candidate_windows.unaccounted_wall_time, []

    def burst_once(*args: object) -> str | None:
        calls.append(args)
        return "stretched by a burst" if len(calls) == 1 else real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(candidate_windows, "unaccounted_wall_time", burst_once)
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert len(calls) == 2
    assert verdict.ok and verdict.runtime is not None, verdict.message


def test_writing_outside_its_folders_is_refused(mlp_task: Task, fast_config: EvalConfig,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "written-by-candidate"
    monkeypatch.setenv("PIKE_TEST_TARGET", str(target))
    verdict = evaluate(mlp_task, candidate("writes_outside"), fast_config)
    assert verdict.status == "rejected", verdict.message
    assert f"writing {target}" in verdict.message
    assert not target.exists()


def test_network_access_is_refused(mlp_task: Task, fast_config: EvalConfig,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        monkeypatch.setenv("PIKE_TEST_PORT", str(server.getsockname()[1]))
        verdict = evaluate(mlp_task, candidate("opens_socket"), fast_config)
        assert verdict.status == "rejected", verdict.message
        assert "network access" in verdict.message
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.mark.parametrize(("address", "refused"), [
    (("::1", 0), False), (("127.0.0.1", 0), False),  # urllib3's import-time probe
    (("0.0.0.0", 0), True), (("127.0.0.1", 8080), True), (("localhost", 0), True),
    ("/tmp/a-unix-socket", True),
])
def test_only_a_loopback_bind_on_port_0_passes_the_network_guard(address: object,
                                                                 refused: bool) -> None:
    guards = Guards(writable=[], armed=True)
    if refused:
        with pytest.raises(PermissionError):
            guards._audit("socket.bind", (None, address), sys._getframe(), False)
        assert guards.violations == ["network access"]
    else:
        guards._audit("socket.bind", (None, address), sys._getframe(), False)
        assert guards.violations == []
    with pytest.raises(PermissionError):
        guards._audit("socket.connect", (None, ("127.0.0.1", 0)), sys._getframe(), False)


def test_a_candidate_importing_urllib3_style_probes_is_judged(mlp_task: Task,
                                                              fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("probes_loopback"), fast_config)
    assert verdict.status == "ok", verdict.message


# the candidate fails if the library's hook runs: a hook left in place is code of the
# library's that every event runs, and filelock's reads a keyword default the candidate
# can swap for an object of its own (a review's candidate read the sealed probes so)
_IMPORTS_A_HOOKING_LIBRARY = candidate("fused").replace(
    "        super().__init__()", """        super().__init__()
        import sys

        import filelock
        sys.audit("stand_in.ping")
        if filelock.HEARD:
            raise RuntimeError("the library's hook runs: " + ", ".join(filelock.HEARD))""", 1)


def test_a_library_that_adds_its_own_audit_hook_as_imported_is_no_violation(
        mlp_task: Task, fast_config: EvalConfig, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # filelock 4 does so on CPython 3.12 (not 3.11, which this host runs: a stand-in takes
    # its name); a torch.compile in a candidate's __init__ imported it and was `rejected`
    # for sys.addaudithook() on an H100. Imported before the guards' hook, with its own
    # hook left out: the candidate's import is no violation, and no hook of it runs.
    (tmp_path / "filelock").mkdir()
    (tmp_path / "filelock" / "__init__.py").write_text(
        "import sys\n\nHEARD = []\n\n\ndef _hook(event, args):\n"
        "    if event.startswith('stand_in.'):\n        HEARD.append(event)\n\n\n"
        "sys.addaudithook(_hook)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    assert "import filelock" in _IMPORTS_A_HOOKING_LIBRARY
    # the OS sandbox mounts the child's sys.path as the first evaluation found it
    from pike.evaluate import os_sandbox
    for found in (os_sandbox._system_paths, os_sandbox._child_sys_path):
        found.cache_clear()
    try:
        verdict = evaluate(mlp_task, _IMPORTS_A_HOOKING_LIBRARY, fast_config)
    finally:
        monkeypatch.undo()
        for found in (os_sandbox._system_paths, os_sandbox._child_sys_path):
            found.cache_clear()
    assert verdict.status == "ok", verdict.message


def test_changed_backend_flags_are_reported_not_hidden(mlp_task: Task,
                                                       fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("changes_flags"), fast_config)
    assert verdict.status == "ok", verdict.message
    assert {"cuda.matmul.allow_tf32", "cudnn.benchmark"} <= set(verdict.flags_changed)
    assert "cudnn.benchmark" in verdict.guards["backend flags"]


def test_tf32_set_by_torchs_newer_api_is_reported_not_crashed(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    # after it, torch's older getters raise; the guard that read them crashed the child
    from pike.audit.precision import detect_precision

    verdict = evaluate(mlp_task, candidate("new_tf32_api"), fast_config)
    assert verdict.status == "ok", verdict.message
    assert verdict.flags_changed["cuda.matmul.fp32_precision"].endswith("-> tf32")
    assert detect_precision("", "", verdict) == ["tf32"]
    assert detect_precision(candidate("new_tf32_api"), mlp_task.source) == ["tf32"]


def test_an_honest_candidate_passes_every_guard_and_says_which_ran(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.status == "ok", verdict.message
    assert verdict.flags_changed == {}
    for guard in ("audit hook", "other distribution", "after timing", "leftover processes",
                  "process sandbox"):
        assert guard in verdict.guards
    assert verdict.guards["after timing"].startswith("new values")


def test_a_thread_pool_whose_workers_are_done_when_the_call_ends_is_no_violation(
        mlp_task: Task, fast_config: EvalConfig) -> None:
    # the guard looks at what a pool's workers run after the call (pool_outlives): one
    # whose work is all waited for inside the call is honest
    verdict = evaluate(mlp_task, candidate("pool_honest"), fast_config)
    assert verdict.status == "ok", verdict.message


def test_a_waiting_timer_of_the_candidate_s_is_a_stray_thread() -> None:
    """threading.Timer waits in threading's own code, then runs its function: one of the
    candidate's ran between the guards' looks, unseen while it waited. torch's pass."""
    import functools
    import sys
    import threading

    import torch

    from pike.evaluate.guards import _runs_user_code

    def payload() -> None:
        pass

    for fn, user in ((payload, True), (functools.partial(payload), True), (print, True),
                     (torch.zeros, False), (functools.partial(torch.zeros, 1), False)):
        timer = threading.Timer(60.0, fn)
        timer.start()
        try:
            stack = None
            for _ in range(100):  # until it waits
                stack = sys._current_frames().get(timer.ident or 0)
                if stack is not None:
                    break
            assert _runs_user_code(timer, stack) is user, fn
        finally:
            timer.cancel()
            timer.join()


def test_reading_frames_of_its_own_is_no_violation(mlp_task: Task,
                                                  fast_config: EvalConfig) -> None:
    # the frame attributes refused for the evaluator's frames (tb_frame, gi_frame) pass
    # for the candidate's own
    verdict = evaluate(mlp_task, candidate("reads_its_own_frames"), fast_config)
    assert verdict.status == "ok", verdict.message


def test_the_probes_wait_sealed_and_go_only_to_the_rotation_s_own_call() -> None:
    """Nothing the rotation holds lists the probes; a take the seal finds foreign ends
    it, says so, and the rotation goes on with its own sets."""
    from pike.evaluate import timed_calls

    tampered: list[str] = []
    foreign = [False]
    rotation = timed_calls.InputRotation([["a"], ["b"]], probes=[["p0"], ["p1"], ["p2"]],
                                         taker_is_foreign=lambda frame, thread: foreign[0],
                                         tampered=tampered.append)
    held = [list(v.values()) if isinstance(v, dict) else v for v in vars(rotation).values()
            if isinstance(v, (list, tuple, dict))]
    assert not any(["p0"] in v or "p0" in str(v) for v in held), held
    call = rotation.caller(lambda x: x)
    rotation.probe_next = True
    assert call() == "p0" and rotation.last_was_probe and not tampered
    foreign[0] = True  # as a next() of the candidate's, or the call made inside a call
    rotation.probe_next = True
    assert call() == "a" and not rotation.last_was_probe
    assert tampered == ["taking the timing's probe sets out of turn"]
    foreign[0] = False
    rotation.probe_next = True
    assert call() == "b" and rotation.used_probes == 1  # the seal stays broken


def test_the_shared_trial_inputs_are_read_only(mlp_task: Task, fast_config: EvalConfig) -> None:
    from pike.evaluate.reference_cache import _references

    evaluate(mlp_task, candidate("fused"), fast_config)
    run = next(iter(_references.values()))
    # Read-only for every user but root; the audit hook refuses the write for root too.
    assert run.inputs_dir.stat().st_mode & 0o222 == 0
    for path in run.inputs_dir.iterdir():
        assert path.stat().st_mode & 0o222 == 0


def test_the_wall_clock_check_tells_forged_timings_from_an_overloaded_host() -> None:
    from pike.evaluate.timing_window import Timer
    from pike.evaluate.wall_clock_check import LoopCost, unaccounted_wall_time

    cost = LoopCost(per_block_s=0.001, per_call_s=0.0001)
    honest = [(0.012, [1.0] * 10)] * 4  # 10 ms reported in 12 ms of wall time
    stretched = [(0.5, [1.0] * 10)] * 4  # 10 ms reported in 500 ms of wall time
    reference = Timer(child=None, mode="eager", blocks=list(honest))  # type: ignore[arg-type]
    forged = Timer(child=None, mode="candidate", blocks=list(stretched))  # type: ignore[arg-type]
    assert "do not account" in (unaccounted_wall_time(cost, forged, reference) or "")
    fine = Timer(child=None, mode="candidate", blocks=list(honest))  # type: ignore[arg-type]
    assert unaccounted_wall_time(cost, fine, reference) is None
    # the host stalled both processes alike: no verdict against the candidate
    loaded = Timer(child=None, mode="eager", blocks=list(stretched))  # type: ignore[arg-type]
    assert unaccounted_wall_time(cost, forged, loaded) is None
    # ... unless this is the second look at a window that was clearly forged
    assert "do not account" in (unaccounted_wall_time(cost, forged, loaded, strict=True) or "")
    # ... but a candidate whose blocks stretch far beyond the loaded reference's is forged
    far = Timer(child=None, mode="candidate",  # type: ignore[arg-type]
                blocks=[(20.0, [1.0] * 10)] * 4)
    assert "do not account" in (unaccounted_wall_time(cost, far, loaded) or "")


def test_reused_answers_show_in_the_probes_and_noise_does_not() -> None:
    from pike.evaluate.check import slow_probes

    def caught(samples: list[float], probes: list[float],
               reference: list[float] | None = None) -> bool | None:
        """True: rejected; False: the figure withheld; None: nothing seen."""
        slow = slow_probes(samples, probes, reference)
        return None if slow is None else slow.reused

    honest = [0.4] * 100
    steady_reference = [1.0] * 90 + [1.1] * 10
    assert caught(honest, [0.41, 2.4, 0.45], steady_reference) is None  # one probe hit by load
    assert caught(honest, [3.9, 3.8], steady_reference) is True  # every probe slow
    assert caught(honest, [9.0], steady_reference) is None  # one probe says nothing yet
    # no reference calls: not known steady, but every probe is far beyond even the tail
    assert caught(honest, [3.9, 3.8]) is True
    # a fast median under a slow tail made of honest calls: slow probes, and no figure
    shaped = [0.12] * 87 + [1.4] * 13
    assert caught(shaped, [1.0, 1.1], steady_reference) is False
    assert "its own calls were not steady" in slow_probes(shaped, [1.0, 1.1],
                                                          steady_reference).message
    # ... and on a loaded host, where the reference's calls had a tail of their own, two
    # probes held up by the scheduler are no proof: the tail is the bar there
    loaded = [1.0] * 60 + [13.0] * 40
    loaded_reference = [1.2] * 60 + [14.0] * 40
    assert caught(loaded, [13.0, 9.0], loaded_reference) is None
    assert caught(loaded, [13.0, 9.0], steady_reference) is False  # its own tail alone
    assert caught([1.0] * 85 + [4.0] * 15, [13.0, 9.0], loaded_reference) is None
    # ... but probes far beyond even the slow tail are reuse in any window
    assert caught([1.0] * 100, [13.0, 9.0], loaded_reference) is True
    assert caught(shaped, [9.0, 9.5], loaded_reference) is True
    # probes within the bar say nothing, steady or not
    assert caught(loaded, [2.9, 5.0], loaded_reference) is None


def test_only_plain_outputs_are_walked() -> None:
    import collections

    import torch

    from pike.evaluate.check import odd_output_part

    t = torch.ones(2)
    pair = collections.namedtuple("pair", "a b")
    assert odd_output_part(t) is None
    assert odd_output_part((t, [t, {"k": t, 3: 1.0}], pair(t, t), torch.max(t, 0), None)) is None
    assert odd_output_part(torch.nn.Parameter(t)) == "Parameter"

    class Walked(tuple):
        def __iter__(self):
            return iter(())

    class Key(str):
        pass

    assert odd_output_part([t, Walked((t,))]) == "Walked"
    assert odd_output_part({Key("k"): t}) == "Key"

    class Trap:  # a key whose hash would run the candidate's code
        armed = False

        def __hash__(self) -> int:
            if Trap.armed:
                raise AssertionError("the check ran the key's own code")
            return 1

    trapped = {Trap(): t}
    Trap.armed = True
    assert odd_output_part(trapped) == "Trap"

    class Liar(type):
        def __getattribute__(cls, name):
            return getattr(tuple, name) if name in ("__iter__", "__getitem__") else (
                type.__getattribute__(cls, name))

    class Lying(tuple, metaclass=Liar):
        def __iter__(self):
            return iter(())

    assert odd_output_part(Lying((t,))) == "Lying"
    deep: list = [t]
    for _ in range(40):
        deep = [deep]
    assert odd_output_part(deep) == "list"
    shared: list = [t, t]  # 2^32 parts from 32 lists: the walk ends at the budget
    for _ in range(31):
        shared = [shared, shared]
    assert odd_output_part(shared) == "nest of over 10,000 parts"
    assert odd_output_part([t] * 9_999) is None  # a long but honest list passes


MANY_TINY_OUTPUTS = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return tuple(x + i for i in range(8))


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
'''


def test_a_load_of_milliseconds_per_block_is_not_taken_for_forged_microsecond_calls() -> None:
    """The CI flake behind the test below, in numbers: blocks of five 20 us calls, the
    host adding about 5 ms to every block. The slack took the reference's to a stretch of
    -0.67 (it read -1.77 in CI), so its ratio allowed the candidate nothing beyond 2, and
    the candidate's blocks, 0.6 ms longer, read 4.3. Against the reference's load in
    seconds the candidate is within the margin; a forger beside the same reference is not."""
    from pike.evaluate.timing_window import Timer
    from pike.evaluate.wall_clock_check import LoopCost, unaccounted_wall_time

    cost = LoopCost(per_block_s=0.001, per_call_s=0.0001)
    samples = [0.02] * 5  # ms; with the untimed first call, 0.12 ms reported a block

    def timer(mode: str, extra_s: float) -> Timer:
        wall = cost.per_block_s + 6 * cost.per_call_s + 0.00012 + extra_s
        return Timer(child=None, mode=mode, blocks=[(wall, samples)] * 10)  # type: ignore[arg-type]

    reference = timer("eager", 0.0048)
    assert unaccounted_wall_time(cost, timer("candidate", 0.0054), reference) is None
    # 30 ms of work a block reported as 0.12 ms is no host's load
    assert "do not account" in (unaccounted_wall_time(cost, timer("candidate", 0.030),
                                                       reference) or "")


def test_an_honest_candidate_of_microsecond_calls_is_not_taken_for_a_forger(
        tmp_path: Path, fast_config: EvalConfig) -> None:
    # Between its timed calls a guarded child samples outputs (here 8 leaves) and looks for
    # patches after each block: milliseconds the parent's wall clock sees and the calls'
    # samples do not. Blocks of a few microsecond calls made that look like forged timings
    # (on a busy CI host: caches_by_pointer got `rejected` instead of `incorrect`) until the
    # trusted calibration did the same work.
    task_path = tmp_path / "many_tiny_outputs.py"
    task_path.write_text(MANY_TINY_OUTPUTS)
    task = Task.from_file(task_path)
    honest = MANY_TINY_OUTPUTS.replace("class Model(", "class ModelNew(")
    config = fast_config.model_copy(update={"timing": fast_config.timing.model_copy(
        update={"max_calls": 100})})  # 5 calls a block: the time around them dominates
    for _ in range(2):
        verdict = evaluate(task, honest, config)
        assert verdict.status == "ok", verdict.message


def test_the_reference_s_blocks_do_the_work_a_guarded_candidate_s_do(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference timed beside a candidate is the control that tells a loaded host from
    forged timings: its blocks must cost what the candidate's cost around their calls
    (outputs sampled, the guards' look after each block). Without that work, load that
    made it dearer than calibrated stretched the candidate's blocks alone: on a CPU host
    kept busy, the reference's median stretch was -0.50 beside the candidate's 0.28 (8
    output leaves, microsecond calls), and on an H200 beside a busy audit a correct Triton
    candidate was rejected as a forger."""
    from pike.evaluate import candidate_windows

    controls = []
    real = candidate_windows.unaccounted_wall_time

    def spy(cost, judged, reference, strict=False):  # type: ignore[no-untyped-def]
        controls.append(reference)
        return real(cost, judged, reference, strict)

    monkeypatch.setattr(candidate_windows, "unaccounted_wall_time", spy)
    verdict = evaluate(mlp_task, candidate("fused"), fast_config)
    assert verdict.status == "ok", verdict.message
    assert controls and all(reference.mode == "eager" and reference.rehearsed > 0
                            and not reference.outputs for reference in controls)


def test_the_references_rehearsed_sampling_drops_what_it_takes_and_never_fails() -> None:
    """The reference samples its outputs only for the cost: nothing is sent, and an output
    no sample can be taken of (sparse, quantized) must not fail a mode that timed fine."""
    import torch

    from pike.evaluate.timed_calls import InputRotation, RehearsedSamples

    work = RehearsedSamples(InputRotation([[]]))
    sparse = torch.eye(4).to_sparse()
    quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    for _ in range(40):  # about half the calls are sampled, at most 8 a block
        work(torch.randn(5, 5))
        work((sparse, quantized))
    assert work.take() == (None, None)
    assert 0 < work.rehearsed <= RehearsedSamples.PER_BLOCK


def test_a_probe_drawn_at_a_block_s_end_is_timed_not_taken_by_the_next_refill(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block starts with one untimed call (timing.time_block). A probe drawn after
    the last timed call of a block went to that call, untimed and unsampled: with one
    timed call a block (calls of 50 ms and more in a full window), no probe was ever
    timed and the reuse check never ran."""
    from pike.evaluate import timed_calls

    monkeypatch.setattr(timed_calls, "_draw_below", lambda n: 0)  # a probe after every call
    rotation = timed_calls.InputRotation([["a"], ["b"], ["c"]], probes=[["p0"], ["p1"], ["p2"]])
    sampler = timed_calls.TimedOutputSamples(rotation)
    call = rotation.caller(lambda x: x)
    monkeypatch.setattr(timed_calls.check, "flatten_output", lambda out: [])
    timed_probes, untimed = [], []
    for _ in range(4):  # four blocks of one timed call each, as the child runs them
        untimed.append(call())  # the refill
        sampler(call())
        timed_probes.append(sampler.take()[1])
    assert not any(x.startswith("p") for x in untimed), untimed
    # the first draw comes after block 1's call; a block whose call was a probe draws
    # none (one a block at most), so every other block's call is one
    assert timed_probes == [[], [0], [], [0]]
    assert rotation.used_probes == 2


def test_withheld_probes_are_told_only_where_chance_cannot_explain_them() -> None:
    """Fewer than two probes in WITHHELD_MIN_CALLS timed calls is under one in a million
    for an honest child drawing one in timed_calls.PROBE_ONE_IN after each call; one call fewer
    is not, and is let pass."""
    from pike.evaluate import check, timed_calls

    def chance_of_fewer_than_two(calls: int) -> float:
        miss = 1 - 1 / timed_calls.PROBE_ONE_IN
        draws = calls - 1
        return miss ** draws + draws * (1 / timed_calls.PROBE_ONE_IN) * miss ** (draws - 1)

    n = check.WITHHELD_MIN_CALLS
    assert chance_of_fewer_than_two(n) < 1e-6 <= chance_of_fewer_than_two(n - 1)
    assert check.withheld_probes_problem(n - 1, 0) is None
    assert check.withheld_probes_problem(n, 2) is None
    assert "withheld" in (check.withheld_probes_problem(n, 1) or "")
    assert "withheld" in (check.withheld_probes_problem(5000, 0) or "")


def test_a_mode_left_in_force_is_named_and_the_default_device_is_not() -> None:
    import torch
    from torch.overrides import TorchFunctionMode

    from pike.evaluate.check import mode_in_force

    class Watching(TorchFunctionMode):
        pass

    assert mode_in_force() is None
    with Watching():
        assert mode_in_force() == "Watching"
    with torch.device("cpu"):  # torch.set_default_device's own context
        assert mode_in_force() is None


def test_what_a_call_left_behind_is_named_once_for_both_the_trials_and_the_sampler() -> None:
    import torch
    from torch.overrides import TorchFunctionMode

    from pike.evaluate import timed_calls

    class Watching(TorchFunctionMode):
        pass

    class Odd(torch.Tensor):
        pass

    plain = [torch.ones(2), {"a": (torch.zeros(1),)}]
    assert timed_calls.left_behind(plain, "a timed call") is None
    odd = torch.ones(2).as_subclass(Odd)
    assert timed_calls.left_behind([odd], "a timed call").startswith(
        "to return a Odd from a timed call")
    with Watching():
        assert timed_calls.left_behind(plain, "its call").startswith(
            "to leave a Watching in force after its call")
    lib = torch.library.Library("aten", "IMPL")  # the attack itself, undone below
    try:
        lib.impl("abs", lambda x: x, "CPU")
        assert timed_calls.left_behind(plain, "a timed call", kernels=False) is None
        assert "aten::abs" in timed_calls.left_behind(plain, "a timed call")
    finally:
        lib._destroy()
    assert timed_calls.left_behind(plain, "a timed call") is None
    lib = torch.library.Library("aten", "IMPL")  # the input check's comparison, answered
    try:
        lib.impl("equal", lambda a, b: True, "CPU")
        assert "aten::equal" in timed_calls.left_behind(plain, "its call")
    finally:
        lib._destroy()
    assert timed_calls.left_behind(plain, "a timed call") is None


def test_a_memo_that_shapes_its_tail_gets_no_figure_in_a_steady_window(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """memo_shapes_its_tail lifts the 90th percentile of its calls with honest ones while
    its median stays fast (`ok` at 8x on the CPU against the 90th percentile). Where the
    reference's calls were steady its probes are slow against its median and its own
    tail is its own doing: `rejected`, or `ok` with the figure withheld, never a figure a
    search could take beyond what the reuse check bounds. That bound is
    check._REUSE_RATIO times the memo's median plus check._REUSE_SLACK_MS: on a fast host
    an honest call of this task takes under it, and the memo's figure (3.33x in a CI run)
    is one the check lets through by design, as on the H100 (bench/results/
    adversarial-h100.md). On a loaded host the tail is the bar (an honest candidate's
    probes may all fall in it), and the test says so instead of passing."""
    import statistics

    from pike.evaluate import check

    real, windows = check.slow_probes, []

    def recorded(samples: list[float], probes: list[float],
                 reference: list[float] | None = None) -> check.SlowProbes | None:
        if reference and len(reference) >= check.REUSE_MIN_SAMPLES:
            windows.append((statistics.quantiles(reference, n=4)[-1]
                            / statistics.median(reference), statistics.median(samples)))
        return real(samples, probes, reference)

    monkeypatch.setattr(check, "slow_probes", recorded)
    verdict = evaluate(mlp_task, candidate("memo_shapes_its_tail"), fast_config)
    if verdict.status == "rejected":
        assert "reused, not computed" in verdict.message or "wall time" in verdict.message
        return
    assert verdict.status == "ok", verdict.message
    if verdict.speedup is not None:
        assert windows, verdict
        spread, typical = windows[-1]
        if spread > check.STEADY_SPREAD:
            pytest.skip(f"the reference's window was not steady here (third quartile "
                        f"{spread:.1f}x its median): the tail was the bar")
        # the probes are honest calls, the reference's too: a figure within the bound
        # (with a quarter for the two models' own difference) is the check's by design
        bound = (check._REUSE_RATIO * typical + check._REUSE_SLACK_MS) / typical
        assert verdict.speedup <= 1.25 * bound, (
            f"a steady window let a shaped memo through at {verdict.speedup:.2f}x, "
            f"beyond the reuse check's bound of {bound:.2f}x")
        return
    assert verdict.noisy and not verdict.rankable, verdict
    assert "its own calls were not steady" in verdict.noisy_why


def test_callbacks_installed_are_named_and_no_collection_holds_the_collector() -> None:
    import gc
    import signal

    from pike.evaluate import callbacks

    before = callbacks.snapshot()
    assert callbacks.changed_since(before) == []  # new tuples, same ints and handlers
    previous = signal.signal(signal.SIGUSR2, lambda *a: None)
    hook = lambda phase, info: None  # noqa: E731 - a collector callback of a test's own
    gc.callbacks.append(hook)
    try:
        assert callbacks.changed_since(before) == [
            "a handler of its own for SIGUSR2", "a garbage collector callback of its own"]
    finally:
        signal.signal(signal.SIGUSR2, previous)
        gc.callbacks.remove(hook)
    assert callbacks.changed_since(before) == []  # put back: nothing to name
    with callbacks.no_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
