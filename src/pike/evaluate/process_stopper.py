"""Stopping and resuming process trees from a small helper process, not the parent.

A timer stops every other evaluation's process tree for its window (device_lock.py): a
walk of the host's processes, one read of /proc/N/stat each, then a signal to each process
of the trees, and the same signals again to let them go. Done in the parent, that walk ran
among its evaluation threads: every file read lets go of the GIL and then waits to get it
back behind whichever thread is computing. On an H200 level2 bench (16 evaluations, pike
at d0176d4) stopping the others took 0.58 s median of each candidate window's 1.69 s hold
(up to 5.4 s), every other evaluation on the GPU stood stopped meanwhile; on a 2-core host
with 400 processes, one busy thread in the parent made the walk take 24 s instead of
0.08 s. The helper walks and signals in a process of its own, so the parent waits for one
reply instead of hundreds of file reads.

A process is named by its pid and its start in clock ticks since boot (field 22 of its
stat file), so a pid reused meanwhile is never signalled. Only the standard library here:
the helper runs this file with `python -I -S`. Where the helper cannot be had (it would
not start, died, or did not answer in time), the same functions run in the parent.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

Proc = tuple[int, int]  # pid, start in clock ticks since boot

# A listing entry is renamed a moment after it is written: one older than this was left
# by a lister that was killed in between (device_lock.list_child).
_PART_STALE_S = 60.0
# A reply later than this: the helper is stuck (or was stopped by someone); the parent
# kills it and does the work itself. A walk of thousands of processes takes well under 1 s.
_REPLY_S = 20.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _fields(pid: int) -> list[bytes] | None:
    """The fields of `pid`'s stat file after its name (state, parent, ...), or None where
    it has ended."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # the name in parentheses may hold spaces and parentheses: fields follow the last ')'
    return text[text.rfind(b")") + 2:].split()


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start ticks) of `pid`, or None where it has ended."""
    fields = _fields(pid)
    try:
        return (int(fields[1]), int(fields[19])) if fields else None
    except (IndexError, ValueError):
        return None


def is_stopped(pid: int) -> bool:
    """Whether `pid` stands stopped by a signal (state T): one read of its stat file, as a
    waiting child's watchdog asks it at every poll (psutil took two)."""
    fields = _fields(pid)
    return bool(fields) and fields[0] == b"T"


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (None where it has ended): unlike a
    time since the epoch (boot time + ticks, as psutil's create_time says it), it does not
    move when the wall clock is set, so two processes reading it at different times agree."""
    found = _stat(pid)
    return None if found is None else found[1]


def start_tag(pid: int) -> str | None:
    """`pid`'s start as the listing entries and pike's temp-folder names write it,
    `t<ticks>` (None where it has ended)."""
    ticks = start_ticks(pid)
    return None if ticks is None else f"t{ticks}"


def _same_start(pid: int, written: str) -> bool:
    """Whether `pid` is the process a listing entry names: `t<ticks>` since 2026-12-04;
    before, the start in seconds since the epoch (an older pike listing on this host)."""
    if written.startswith("t"):
        return written == start_tag(pid)
    ticks = start_ticks(pid)
    if ticks is None:
        return False
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
        return abs(ticks / _CLOCK_TICKS + boot - float(written or 0)) <= 0.01
    except (OSError, StopIteration, ValueError):
        return False


def trees(roots: list[int]) -> list[Proc]:
    """The processes of the trees under `roots`, roots included, from one pass over the
    host's processes (a child's tree: bwrap, the runner, compile workers, what it
    started)."""
    below: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        found = _stat(int(name))
        if found is not None:
            below.setdefault(found[0], []).append(int(name))
            ticks[int(name)] = found[1]
    todo = [pid for pid in dict.fromkeys(roots) if pid in ticks]
    seen = set(todo)
    while todo:
        for pid in below.get(todo.pop(), []):
            if pid not in seen:
                seen.add(pid)
                todo.append(pid)
    return [(pid, ticks[pid]) for pid in seen]


def signal_all(procs: list[Proc], sig: int) -> None:
    """`sig` to each of `procs` that still is the process it was."""
    for pid, ticks in procs:
        found = _stat(pid)
        if found is None or found[1] != ticks:
            continue
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_trees(roots: list[int]) -> list[Proc]:
    """SIGSTOP the process trees under `roots`; the processes stopped."""
    stopped: dict[int, int] = {}
    # again until no process is new: one may start between a tree's listing and its stop
    for _ in range(8):
        late = [p for p in trees(roots) if p[0] not in stopped]
        if not late:
            break
        signal_all(late, signal.SIGSTOP)
        stopped.update(late)
    return list(stopped.items())


def stop_listed(folder: str, keep: list[int], settle_s: float = 0.0) -> list[Proc]:
    """SIGSTOP the trees of the children listed in `folder` but `keep`; entries of ended
    processes (or of a reused pid) are dropped, and so are half-written ones a killed
    lister left. Where any process was stopped, `settle_s` for the kernels it had queued."""
    roots = []
    for entry in Path(folder).iterdir():
        if entry.name.endswith(".part"):
            _drop_if_stale(entry)
            continue
        try:
            pid, written = int(entry.name), entry.read_text()
        except (ValueError, OSError):
            continue
        if pid in keep:
            continue
        if not _same_start(pid, written):  # ended, or the pid names another process now
            entry.unlink(missing_ok=True)
            continue
        roots.append(pid)
    stopped = stop_trees(roots)
    if stopped and settle_s > 0:
        time.sleep(settle_s)
    return stopped


def _drop_if_stale(entry: Path) -> None:
    try:
        if time.time() - entry.stat().st_mtime > _PART_STALE_S:
            entry.unlink(missing_ok=True)
    except OSError:
        pass


_OPS = {"trees": trees, "signal_all": signal_all, "stop_trees": stop_trees,
        "stop_listed": stop_listed}


def _as_procs(found: object) -> object:
    return [tuple(p) for p in found] if isinstance(found, list) else found


def helper_pid() -> int | None:
    """The helper's pid where this process has one running: the evaluator's own, which
    lives as long as this process does (no evaluation's)."""
    proc = _helper.running()
    return proc.pid if proc is not None else None


def call(op: str, **args: object) -> object:
    """`op` (a function above) with `args`, done by the helper where it can be had."""
    return _helper.call(op, args)


class _Helper:
    """The parent's end: one helper per process (a fork starts afresh, below), one request
    at a time. Three failures in a row and the parent does the work itself from then on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._failures = 0
        self._asked = 0  # requests sent: each carries its number, and so does its reply
        self._unread = b""  # what came from the helper after the last whole reply

    def running(self) -> subprocess.Popen[bytes] | None:
        """The helper, where it is running."""
        return self._proc if self._proc is not None and self._proc.poll() is None else None

    def call(self, op: str, args: dict[str, object]) -> object:
        with self._lock:
            if self._failures < 3:
                try:
                    reply = self._ask(op, args)
                    self._failures = 0
                    return _as_procs(reply)
                except (OSError, ValueError, TimeoutError, KeyError) as err:
                    self._failures += 1
                    log.warning("the process stopper failed (%s): this %s in the parent",
                                err, op)
                    self._end()
                except BaseException:
                    # interrupted (Ctrl-C) between request and reply: the unread reply, or a
                    # request half-flushed into the pipe, goes with this helper
                    self._end()
                    raise
        return _OPS[op](**args)  # type: ignore[operator]

    def _ask(self, op: str, args: dict[str, object]) -> object:
        proc = self._started()
        assert proc.stdin is not None and proc.stdout is not None
        self._asked += 1
        proc.stdin.write(json.dumps({"id": self._asked, "op": op, "args": args}).encode() + b"\n")
        proc.stdin.flush()
        deadline = time.monotonic() + _REPLY_S
        while True:
            reply = json.loads(self._line(proc.stdout.fileno(), deadline))
            if not isinstance(reply, dict):
                raise ValueError(f"not a reply: {reply!r:.80}")
            if reply.get("id") is None and "error" in reply:  # a request it could not read
                raise ValueError(reply["error"])
            # a reply to an earlier request (one whose caller was interrupted before it read
            # it) is not this one's answer: a hold given the processes another call stopped
            # would let go of the wrong ones
            if reply.get("id") == self._asked:
                break
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply["result"]

    def _line(self, fd: int, deadline: float) -> bytes:
        """The helper's next reply line, read from the pipe itself: a buffered reader could
        hold a line that select would not see."""
        while b"\n" not in self._unread:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no reply in {_REPLY_S:g} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise OSError("the helper ended")
            self._unread += chunk
        line, _, self._unread = self._unread.partition(b"\n")
        return line

    def _started(self) -> subprocess.Popen[bytes]:
        running = self.running()
        if running is not None:
            return running
        self._end()  # one that ended: reaped, its pipes closed
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        return self._proc

    def _end(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._proc = None
        self._unread = b""


_helper = _Helper()
# a forked child starts its own helper, and its lock free: another thread may have held
# it, and the parent's helper is the parent's to end
os.register_at_fork(after_in_child=_helper.__init__)


def serve() -> None:
    """The helper: one JSON request a line on stdin, one reply a line on stdout, until
    stdin closes: the parent's end closes when it exits, however it ends (kill -9 too).
    Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for line in sys.stdin.buffer:
        asked = None
        try:
            request = json.loads(line)
            asked = request["id"]
            reply = {"id": asked, "result": _OPS[request["op"]](**request["args"])}
        except Exception as err:  # said to the parent, which does the work itself
            reply = {"id": asked, "error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
