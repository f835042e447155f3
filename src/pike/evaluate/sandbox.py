"""The child process that runs untrusted code: scrubbed environment, own dirs, limits.

One child per module under test, started with `spawn` semantics (a fresh interpreter), in
a new session so the whole process group can be killed, with a marker in its environment
so that processes which escape the group (setsid, double fork) are found and killed too.
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

from pike.config import LimitsConfig
from pike.evaluate import child_watch, device_lock, gpu_holders, host_memory, oom_killer
from pike.evaluate.child_ends import (
    ChildExit,
    Event,
    MemoryExceeded,
    PhaseTimeout,
    TooManyProcesses,
    process_limit,
)
from pike.evaluate.child_environment import MARKER_VARIABLE
from pike.evaluate.child_start import SPAWNER, child_setup
from pike.evaluate.disk_use import DiskWatch
from pike.evaluate.held_files import held_bytes
from pike.evaluate.protocol import Channel, ChildRequest
from pike.evaluate.staging import InputStage

_POLL_SECONDS = 0.05
_TIMING_MEMORY_EVERY_S = 1.0
_FILES_EVERY_S = 0.5
_TREE_EVERY_S = 1.0
_MAX_LINE_BYTES = 64 * 2**20  # the evaluator's messages are JSON lines of a few KB
# How often a waiting parent reads the host's out-of-memory kill count while a child
# lives: a child found killed is blamed on the killer only where the count rose since.
_OOM_COUNT_EVERY_S = 1.0



class ChildProcess:
    """One sandboxed child; use as a context manager so it never outlives its evaluation."""

    # The GPU whose timers may stop this child (device_lock.list_child); its phase limits
    # then count only the time it was let run.
    pausable_on: str | None = None
    # The host's out-of-memory kill count when the child was last seen alive, and when
    # that was (monotonic); the child tree's memory when last measured.
    _oom_kills_seen: int | None = None
    _oom_count_seen_at = 0.0
    _last_rss: int | None = None
    peak_rss = 0  # the most the child tree held when measured (host_memory learns from it)
    # what its files in a scratch in memory held when last read, and the most (held_files;
    # host_memory counts them beside the RSS), read at most every _FILES_EVERY_S while
    # it loads and checks
    _last_files = 0
    peak_files = 0
    _files_read = float("-inf")
    _files_of: Path | None = None  # its work folder (set when made)
    _files_lock = threading.Lock()  # one for all children: a read takes a moment
    disk: DiskWatch | None = None  # a candidate's files against its limit, from `begin`
    # the tree's processes as last found, and when (monotonic): _tree_rss
    _tree: tuple[psutil.Process, ...] = ()
    _tree_walked = float("-inf")
    tree_alive = 0  # how many of them were alive when their memory was last read
    # Whether the parent is in `receive` now; if not, child_watch checks the limits, and
    # what ended the child then, for the next receive to give
    _waited = False
    ended_by: MemoryExceeded | TooManyProcesses | None = None
    ended_in = ""  # the phase it was in then
    # held by child_watch's look at a child and by the child's end (__exit__), so no look
    # is under way once a child is ended; one for all children: each look takes a moment
    _watch_lock = threading.Lock()

    def __init__(self, request: ChildRequest, work_dir: Path, env: dict[str, str],
                 limits: LimitsConfig, phase_limits: dict[str, float],
                 prefix: list[str] | None = None, sandboxed: bool = False,
                 stage: InputStage | None = None) -> None:
        self.request, self.work_dir, self.env = request, work_dir, env
        self._files_of = work_dir
        self.prefix = prefix or []
        self.sandboxed = sandboxed  # in bwrap's namespaces: what it starts dies with it
        self.stage = stage
        self.plan_notes: dict[str, str] = {}  # the OS sandbox's namespaces and mounts
        self.memory_limit = int((limits.memory_gib or _default_memory_gib()) * 2**30)
        self.phase_limits = phase_limits
        self.phase = "setup"
        self.phase_started = time.monotonic()
        self.phase_seconds: dict[str, float] = {}
        self._log: Any = None  # the child's output (stdout and stderr), once started
        self.proc: subprocess.Popen[bytes] | None = None
        self._chan: Channel | None = None
        self._from_child = -1
        self._buffer = b""
        # Set once the child overran a phase limit or its memory: it is stuck or runaway,
        # so it will not answer "stop" and is killed at once (driver.finish).
        self.unresponsive = False
        self._ready_at = self.line_ready_at = 0.0  # perf_counter: the last line's arrival
        self._memory_walked = 0.0
        self.begun = False  # the request is handed over by `begin`
        # its timed calls and those on probe sets, over every window it was timed in (a
        # window timed again after a burst of load finds its probes used in the first):
        # check.withheld_probes_problem
        self.timed_calls = self.probes_timed = 0
        self._runner: int | None = None  # the pid of the python that runs it (runner_pid)
        self.see: Callable[[str], str] = str  # a host path as the child sees it
        # its own folders on the host; a candidate's are watched from `begin` (disk_use)
        self.folders: list[Path] = [work_dir]

    def __enter__(self) -> ChildProcess:
        """Start the process: it imports torch and the runner, then waits for `begin`
        before it reads its request or touches a device, so it can start while the
        reference runs, or before the device is held."""
        request_path = self.work_dir / "request.json"
        from_child, child_writes = os.pipe()
        child_reads, to_child = os.pipe()
        # The request as the child sees it: inside the sandbox the work dir is mounted
        # elsewhere (the ChildRequest's paths are already the child's).
        seen_request = self.request.writable[0] + "/request.json" if self.sandboxed else str(
            request_path)
        # The child's output goes to a nameless file in the temp folder, not the scratch
        # one, where a scratch (/dev/shm) filled by other evaluations' tensors would cut
        # it: on the H100 a crashed child's message ended before its error line, likely
        # so. Nothing of it survives a kill, and the child sees only its descriptor.
        try:
            self._log = tempfile.TemporaryFile(prefix="pike-child-")
            self.proc = SPAWNER.run(functools.partial(
                subprocess.Popen,
                [*self.prefix, sys.executable, "-m", "pike.evaluate.runner", seen_request,
                 str(child_writes), str(child_reads)],
                cwd=self.work_dir, env=self.env, stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, pass_fds=(child_writes, child_reads),
                start_new_session=True,
                preexec_fn=child_setup(os.getpid(), oom_killer.child_oom_score(
                    self.request.role if self.request is not None else "candidate"),
                    subreaper=not self.sandboxed),
            ))
            self._see_oom_count(time.monotonic())
        except BaseException:  # no child: nothing of its start may stay open
            for fd in (from_child, to_child):
                os.close(fd)
            if self._log is not None:
                self._log.close()
            raise
        finally:
            os.close(child_writes)
            os.close(child_reads)
        self._from_child = from_child
        self._chan = Channel(to_child)
        gpu_holders.started(self)
        return self

    def begin(self) -> None:
        """Hand the child its request: from here it loads, builds and runs. The phase's
        clock starts now; the wait before was the parent's, not the child's."""
        (self.work_dir / "request.json").write_text(self.request.model_dump_json())
        limit = self.request.file_bytes_limit
        if limit and self._log is not None:
            self.disk = DiskWatch(self.folders, limit, self._log.fileno(), self._tree_pids)
        self.phase_started = time.monotonic()
        self.begun = True
        child_watch.watch(self)
        self.send("begin")

    @property
    def last_rss_bytes(self) -> int | None:
        return self._last_rss

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def __exit__(self, *exc: object) -> None:
        with self._watch_lock:
            child_watch.unwatch(self)
        try:
            self.kill()
        finally:
            host_memory.HOST.release(self)
        if self._log is not None:
            self._log.close()
        os.close(self._from_child)
        if self._chan is not None:
            try:
                os.close(self._chan._write_fd)
            except OSError:
                pass

    def send(self, event: str, **fields: Any) -> None:
        assert self._chan is not None
        try:
            self._chan.send(event, **fields)
        except BrokenPipeError:
            pass  # the child is gone; receive() reports how it ended

    def enter_phase(self, phase: str) -> None:
        now = time.monotonic()
        spent = now - self.phase_started
        self.phase_seconds[self.phase] = self.phase_seconds.get(self.phase, 0.0) + spent
        self.phase, self.phase_started = phase, now

    def read_files(self, now: float | None = None) -> None:
        """Read what its files in memory hold now (held_files) into its last and peak
        figures; measure_memory does so every _FILES_EVERY_S while it loads."""
        with self._files_lock:  # the receive loop, the watch's thread and the caller
            self._files_read = time.monotonic() if now is None else now
            held = held_bytes(self._files_of) if self._files_of is not None else 0
            self._last_files, self.peak_files = held, max(self.peak_files, held)

    def ask_size(self, limit_s: float) -> dict[str, Any] | None:
        """Before `begin`: what the task's inputs, outputs and weights take, as the child
        finds them on the meta device (task_size.on_meta; a reference's child, whose
        module is the task); None where no answer came within `limit_s` (a late one is
        passed over as any event its reader does not wait for) or the child has ended."""
        if self.proc is None or self.begun or self.request.role != "reference":
            return None  # a candidate's code is never run before its limits are in force
        self.send("size", module_path=self.request.module_path)
        deadline = time.monotonic() + limit_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not self._read_some(min(_POLL_SECONDS, left)) and self.proc.poll() is not None:
                return None
        line, rest = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            return None  # left for receive, which says the channel is garbled
        if not isinstance(message, dict) or message.get("event") != "size":
            return None
        self._buffer = rest
        return message

    def receive(self) -> Event:
        """The next message, or how the child ended, timed out or overran its memory.
        The child's requests for its inputs are answered here, on the way."""
        self._waited = True
        try:
            while True:
                event = self._receive_one()
                if not (isinstance(event, dict) and event.get("event") == "stage"):
                    return event
                phase = str(event.get("phase"))
                problem = self.stage.put(phase) if self.stage is not None else (
                    "asked for inputs the evaluator does not stage")
                if problem is not None:
                    return {"event": "failure", "status": "rejected", "phase": self.phase,
                            "message": problem}
                self.send("staged", phase=phase)
        finally:
            self._waited = False

    def permit(self, phase: str) -> None:
        """The child may now have the inputs of `phase` (the parent has started it)."""
        if self.stage is not None:
            self.stage.permitted.add(phase)

    def _receive_one(self) -> Event:
        assert self.proc is not None
        if self.ended_by is not None:  # child_watch ended it while nobody listened
            return self.ended_by
        limit = self.phase_limits.get(self.phase, self.phase_limits["load"])
        looked = time.monotonic()
        while b"\n" not in self._buffer:
            deadline = self.phase_started + limit
            if self._read_some(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
                if b"\n" in self._buffer or time.monotonic() - looked < _POLL_SECONDS:
                    continue
                # Bytes with no line end yet for a poll's time. Candidate code can write into
                # the channel, and a flood of bytes once skipped every limit below: they hold.
                if len(self._buffer) > _MAX_LINE_BYTES:
                    self.unresponsive = True
                    return ChildExit(None, "garbled message on the evaluator channel (no "
                                     "line end in its first 64 MiB)")
            elif self.proc.poll() is not None:
                if self._read_some(0):
                    continue
                if self.ended_by is not None:  # ended by child_watch as this wait began
                    return self.ended_by
                code = self._exit_status()
                return ChildExit(code, self.output_tail(),
                                 host_out_of_memory=self._killed_by_the_oom_killer(code),
                                 last_rss_bytes=self._last_rss)
            now = time.monotonic()
            if now - self._oom_count_seen_at >= _OOM_COUNT_EVERY_S:
                self._see_oom_count(now)
            if self._stopped_by_a_timer():  # another evaluation's window: not its time
                self.not_its_time(now - looked)
            looked = now
            if now >= self.phase_started + limit:
                self.unresponsive = True
                return PhaseTimeout(self.phase, limit)
            if self._memory_due(now) and (over := self.over_limits()) is not None:
                self.unresponsive = True
                return over
            if self.disk is not None and (over := self.disk.over(now, self.phase == "timing")):
                self.unresponsive = True
                return over
        line, self._buffer = self._buffer.split(b"\n", 1)
        self.line_ready_at = self._ready_at
        try:
            message = json.loads(line)
        except ValueError:
            return ChildExit(None, "garbled message on the evaluator channel")
        if message.get("event") == "phase":
            self.enter_phase(str(message["phase"]))
        return message

    def not_its_time(self, seconds: float) -> None:
        """`seconds` of the current phase that another evaluation's timed window took
        (this child stopped, or its parent waiting for the device): they count against no
        limit of its own."""
        self.phase_started += seconds
        self.phase_seconds["paused"] = self.phase_seconds.get("paused", 0.0) + seconds

    def _stopped_by_a_timer(self) -> bool:
        assert self.proc is not None
        if self.pausable_on is None or not device_lock.stopped(self.proc.pid):
            return False
        return device_lock.resume_unless_timed(self.pausable_on, self.proc.pid)

    def wait_unpaused(self, timeout: float = 600.0) -> None:
        """Before it is told to stop: wait out a timer that has it stopped (a stopped
        child answers nothing); let it go on where no timer has it."""
        if self.proc is None:
            return
        started = time.monotonic()
        while self._stopped_by_a_timer() and time.monotonic() - started < timeout:
            time.sleep(_POLL_SECONDS)

    def over_limits(self) -> MemoryExceeded | TooManyProcesses | None:
        """The child tree's memory and process count measured now, and the limit it is
        over, if any."""
        used = self.measure_memory()
        return self._over(used, self.tree_alive)

    def _over(self, used: int, count: int) -> MemoryExceeded | TooManyProcesses | None:
        # the count first: a bomb of light processes is said as one (a bomb of copies of a
        # torch process meets the memory limit first, each copy's shared pages counted
        # again in the tree's memory)
        most = process_limit(self.env)
        if count > most:
            return TooManyProcesses(count, most, self.request.role)
        if used > self.memory_limit:
            return MemoryExceeded(used, self.memory_limit)
        return None

    def check_unwaited(self, tree: list[psutil.Process] | None = None) -> None:
        """child_watch's look, while the parent is not in `receive` (`tree`: the child's
        processes, root first, as the watch found them for every child at once): a child
        over a limit is ended, all it started with it, and the next receive says why.
        Should a receive begin meanwhile, both measure, each finding what the other
        would. A child whose own process ended is looked at through what it left (its
        marked processes): ending itself must not end the watch of a bomb it started."""
        with self._watch_lock:
            proc = self.proc
            if proc is None or self._waited or not self.begun or self.ended_by is not None:
                return
            if proc.poll() is not None:
                over = self._remains_over_limits()
            else:
                if tree:
                    self._tree, self._tree_walked = tuple(tree), time.monotonic()
                over = self.over_limits()
            if over is not None and not self._waited:
                self.ended_by, self.ended_in, self.unresponsive = over, self.phase, True
                self._end_all(proc)

    def _remains_over_limits(self) -> MemoryExceeded | TooManyProcesses | None:
        return self._over(*_memory_and_count(_marked_processes(self.env)))

    def _end_all(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill the child's group, its tree as last found and its marked processes (those
        that left both), as `kill` does, without waiting: the group by its id only while
        the child is not reaped (its id is not yet anyone else's), the rest by psutil's
        handles, which check a process is the one they were made for."""
        if proc.poll() is None:
            self._kill_own_group()
        _kill_each([*self._tree, *_marked_processes(self.env)])

    def measure_memory(self) -> int:
        """The child tree's memory now, kept as its last and peak figures (0: the tree is
        gone, killed meanwhile: not a measurement). Its files in memory are read too,
        while it may still write them (host_memory.LOADING)."""
        used = self._tree_rss()
        if used:
            self._last_rss = used
            self.peak_rss = max(self.peak_rss, used)
        now = time.monotonic()
        if self.phase in host_memory.LOADING and now - self._files_read >= _FILES_EVERY_S:
            self.read_files(now)
        return used

    @property
    def last_files_bytes(self) -> int:
        return self._last_files

    def _memory_due(self, now: float) -> bool:
        """Whether to read the child's tree's memory now: every poll, but while timing at
        most every _TIMING_MEMORY_EVERY_S. Each read of /proc waits for the GIL where
        other threads of this process are busy: a walk of the host's processes (which
        finding the tree is, _tree_rss) took 0.5 s where it takes 1.3 ms alone, and a
        reply that came meanwhile sat unread, the timing block's wall time grown by it."""
        if self.phase == "timing" and now - self._memory_walked < _TIMING_MEMORY_EVERY_S:
            return False
        self._memory_walked = now
        return True

    def _read_some(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._from_child], [], [], timeout)
        if not ready:
            return False
        # Taken before anything else, for a timing block's wall time: when its answer
        # could first be read, not when this thread next got to it.
        self._ready_at = time.perf_counter()
        chunk = os.read(self._from_child, 65536)
        self._buffer += chunk
        return bool(chunk)

    def _tree_rss(self) -> int:
        """The tree's resident memory: each process's read every poll, the tree itself
        found again at most every _TREE_EVERY_S. Finding it reads every process on the
        host (psutil, for their parents), and with a bench's 16 to 20 children polled 20
        times a second those walks kept the parent's threads busy: each file read waits
        for the GIL, and so did everything else the parent did, a timer stopping the
        others among it (process_stopper.py). A process started since the last walk is
        counted from the next one, within a second, as while timing before."""
        assert self.proc is not None
        now = time.monotonic()
        if not self._tree or now - self._tree_walked >= _TREE_EVERY_S:
            try:
                root = psutil.Process(self.proc.pid)
                self._tree = (root, *root.children(recursive=True))
            except psutil.Error:
                self._tree, self.tree_alive = (), 0
                return 0
            self._tree_walked = now
        total, self.tree_alive = _memory_and_count(self._tree)
        return total

    def _tree_pids(self) -> list[int]:
        """The child tree's processes as last found (`_tree_rss` finds them again)."""
        return [p.pid for p in self._tree]

    def _see_oom_count(self, now: float) -> None:
        """The host's out-of-memory kill count, read while this child is known alive."""
        self._oom_kills_seen, self._oom_count_seen_at = oom_killer.host_oom_kills(), now

    def _killed_by_the_oom_killer(self, code: int | None) -> bool:
        """Whether this child's SIGKILL came with the kernel's out-of-memory killer at
        work: pike's own kills (a phase's limit, the memory limit, a cleanup) are told
        apart before a ChildExit is read, and the host's kill count rose since the child
        was last seen alive (at most about a second before). The count is the host's, so
        another process taken in that second looks the same: the cost is a retry."""
        before, now = self._oom_kills_seen, oom_killer.host_oom_kills()
        return (code == -signal.SIGKILL and before is not None and now is not None
                and now > before)

    def _exit_status(self) -> int | None:
        assert self.proc is not None
        code = self.proc.returncode
        if self.sandboxed and code is not None and 128 < code < 128 + 65:
            return -(code - 128)  # bwrap reports a child killed by signal N as 128 + N
        return code

    def stop_watching(self, timeout: float, outlived_s: float) -> list[str]:
        """In the OS sandbox, tell the child to stop, wait for it and name what it left: the
        namespace ends those processes with the child, but they count. Left behind are
        the child's descendants still running once it waited `outlived_s` for them, and
        any process that left its tree (a double fork hands it to the namespace's init)."""
        assert self.proc is not None
        last = self._sandbox_others()  # the child may end at once once told
        self.send("stop")
        started = time.monotonic()
        while self.proc.poll() is None and time.monotonic() - started < timeout:
            last = self._sandbox_others() or last
            time.sleep(0.1)
        waited = time.monotonic() - started
        self.wait_exit(timeout=1.0)
        return [name for name, descends in last.values() if not descends or waited >= outlived_s]

    def _sandbox_others(self) -> dict[int, tuple[str, bool]]:
        """Processes in the sandbox other than bwrap's and the runner: pid -> (name,
        whether it descends from the runner); empty once the runner has ended."""
        assert self.proc is not None
        try:
            inside = [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                      if p.status() != psutil.STATUS_ZOMBIE]
            runner = next((p for p in inside if _is_runner(p)), None)
            if runner is None:
                return {}
            descendants = {c.pid for c in runner.children(recursive=True)}
        except psutil.Error:
            return {}
        found = {}
        for p in inside:
            try:
                name = p.name()
            except psutil.Error:
                continue
            if name != "bwrap" and p.pid != runner.pid:
                found[p.pid] = (f"{name} (pid {p.pid})", p.pid in descendants)
        return found

    def runner_pid(self) -> int | None:
        """The pid of the python process that runs the child: the process itself, or inside
        the OS sandbox the runner under bwrap's; None while it cannot be told."""
        if self._runner is None and self.proc is not None:
            if not self.sandboxed:
                self._runner = self.proc.pid
            else:
                try:
                    self._runner = next((p.pid for p in psutil.Process(self.proc.pid).children(
                        recursive=True) if _is_runner(p)), None)
                except psutil.Error:
                    pass
        return self._runner

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float = 10.0) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def leftover_processes(self, outside_group: bool = False) -> list[str]:
        """Processes started by the child that are still running (the child itself
        excluded); with `outside_group`, only those that left its process group."""
        own = self.proc.pid if self.proc else -1
        return [f"{_name_of(p)} (pid {p.pid})" for p in _marked_processes(self.env)
                if p.pid != own and not (outside_group and _group_of(p) in (own, None))]

    def output_tail(self, limit: int = 2000) -> str:
        if self._log is None or self._log.closed:
            return ""
        try:
            size = os.fstat(self._log.fileno()).st_size
            data = os.pread(self._log.fileno(), limit, max(0, size - limit))
        except OSError:
            return ""
        return data.decode(errors="replace").strip()

    def kill_group(self) -> list[str]:
        """Kill the child's process group at once; the processes it started outside the
        group (a new session) that still run, as `leftover_processes` names them."""
        if self.proc is None:
            return []
        self._kill_own_group()
        self.wait_exit()
        return self.leftover_processes(outside_group=True)  # the group's own are zombies

    def kill(self) -> None:
        if self.proc is None:
            return
        self._kill_own_group()
        _kill_each(_marked_processes(self.env))
        self.wait_exit()

    def _kill_own_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _is_runner(p: psutil.Process) -> bool:
    try:
        return p.cmdline()[1:3] == ["-m", "pike.evaluate.runner"]  # not bwrap's own argv
    except psutil.Error:
        return False


def _memory_and_count(procs: Iterable[psutil.Process]) -> tuple[int, int]:
    """The resident memory of `procs` together, and how many of them are alive."""
    total = alive = 0
    for p in procs:
        try:
            total += p.memory_info().rss
            alive += 1
        except psutil.Error:  # ended since it was found, or a zombie
            pass
    return total, alive


def _kill_each(procs: Iterable[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:  # gone already
            pass


def _name_of(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:  # ended since it was found
        return "ended"


def _group_of(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:  # gone already
        return None


def _marked_processes(env: dict[str, str]) -> list[psutil.Process]:
    marker = env.get(MARKER_VARIABLE)
    if not marker:  # a child pike did not start (tests build some)
        return []
    found = []
    for p in psutil.process_iter():  # no `attrs`: see child_watch._trees
        try:
            if p.pid != os.getpid() and p.environ().get(MARKER_VARIABLE) == marker:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _default_memory_gib() -> float:
    return 0.75 * psutil.virtual_memory().total / 2**30
