"""Evaluations on a Ray cluster: one actor per GPU, each a local pool over its own device.

Each actor holds one GPU (Ray sets CUDA_VISIBLE_DEVICES, so it evaluates on cuda:0) and
runs up to `workers` evaluations at once in threads, as the local pool does on one host:
builds and compiles overlap, while the device lock of that node keeps each timed window
alone on its GPU. A cluster without GPUs gets `workers` CPU actors, one evaluation each.
Nodes share no file system, so a task travels as its file name, source and sha256, and
each actor writes it once into a temp dir of its own.

The driver gives each candidate to the least busy actor with a free slot and yields the
verdicts as they finish. An actor, worker or node lost mid-evaluation gives its candidate
one more try on another actor, and a fresh actor takes the lost one's place; a second loss
is the candidate's `crashed` verdict. The task's own errors (TaskError: the reference
fails) reach the caller as themselves.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
import ray.exceptions

from pike.config import EvalConfig
from pike.errors import EvaluatorError, PikeError
from pike.evaluate.leftovers import make_temp_dir
from pike.evaluate.pool import LocalPool, one_line
from pike.evaluate.reference_cache import close_references
from pike.evaluate.verdict import Verdict
from pike.task import Task
from pike.threads import unwinding_stop

log = logging.getLogger(__name__)

START_SECONDS = 300.0  # an actor not started by then (no free GPU, say) is not waited for
CLOSE_SECONDS = 30.0  # actors' own clean-up (reference children, temp dirs) at close

# How Ray says that an actor, its worker process or its node is gone (names of this Ray).
_LOST: tuple[type[BaseException], ...] = tuple(
    getattr(ray.exceptions, name) for name in (
        "RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
        "NodeDiedError", "LocalRayletDiedError", "ObjectLostError")
    if hasattr(ray.exceptions, name))


@dataclass(frozen=True)
class TaskFile:
    """A task as it travels to another node: its file's name and text, and their sha256."""

    file_name: str
    name: str
    source: str
    sha256: str

    @classmethod
    def of(cls, task: Task) -> TaskFile:
        return cls(task.path.name, task.name, task.source, task.sha256)

    def write(self, folder: Path) -> Task:
        """The task from a copy of its file under `folder`, checked against the sha256."""
        path = folder / self.sha256[:16] / Path(self.file_name).name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.source, encoding="utf-8")
        task = Task.from_file(path)
        if task.sha256 != self.sha256:
            raise EvaluatorError(
                f"{self.file_name}: the task's copy on {socket.gethostname()} differs from the "
                f"source sent (sha256 {task.sha256[:12]}, expected {self.sha256[:12]})")
        return replace(task, name=self.name)


class EvaluationActor:
    """What runs on a Ray worker: a LocalPool over one device, tasks copied to a temp dir."""

    def __init__(self, cfg: EvalConfig, device: str, workers: int) -> None:
        cfg = cfg.model_copy(update={"device": device, "devices": [], "cluster": "local"})
        self._pool = LocalPool(cfg, workers=workers)
        self._folder = make_temp_dir("ray-tasks")
        self._tasks: dict[tuple[str, str], Task] = {}
        self._lock = threading.Lock()

    def where(self) -> str:
        return f"{socket.gethostname()} {self._pool.devices[0]} (pid {os.getpid()})"

    def judge(self, task: TaskFile, source: str) -> dict[str, Any]:
        with self._lock:  # each task written once, also when its candidates arrive at once
            key = (task.file_name, task.sha256)
            if key not in self._tasks:
                self._tasks[key] = task.write(self._folder)
            local = self._tasks[key]
        return self._pool.judge(local, source).model_dump(mode="json")

    def close(self) -> None:
        """Stop the reference children and remove the task copies (before the actor ends)."""
        self._pool.close()
        close_references()
        shutil.rmtree(self._folder, ignore_errors=True)


_RemoteActor = ray.remote(EvaluationActor)


@dataclass(eq=False)
class _Lane:
    """One actor, whether it is up yet, and its evaluations in flight."""

    actor: Any
    slots: int
    starting: Any | None  # the actor's first call (`where`) until it has answered
    where: str = "an evaluation actor"
    running: set[Any] = field(default_factory=set)

    def free(self) -> int:
        return 0 if self.starting is not None else self.slots - len(self.running)


@dataclass
class _Batch:
    """One judge_many call: candidates to place, calls in flight, the first loss of each."""

    queue: deque[int]
    running: dict[Any, tuple[int, _Lane]] = field(default_factory=dict)
    losses: dict[int, str] = field(default_factory=dict)
    lost_on: dict[int, _Lane] = field(default_factory=dict)


class RayPool:
    """Evaluations on the actors of a Ray cluster: one per GPU, or `workers` on CPUs.

    `address` (over `cfg.ray_address`) is the cluster to join; with neither, RAY_ADDRESS,
    and without that a local Ray started for this pool and stopped by `close()`. A Ray
    this process was already connected to, or one it joined, keeps running.
    """

    def __init__(self, cfg: EvalConfig, address: str | None = None,
                 actors: int | None = None) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._lanes: list[_Lane] = []
        self._failures: list[str] = []  # why actors could not start, for the error message
        self._abandoned: dict[Any, _Lane] = {}  # calls of a judge_many its caller left
        self._owns_ray = not ray.is_initialized()
        target = address or cfg.ray_address or None
        try:
            ray.init(address=target, ignore_reinit_error=True, include_dashboard=False,
                     log_to_driver=False)
        except (ConnectionError, TimeoutError) as err:
            raise EvaluatorError(f"cannot join the Ray cluster at "
                                 f"{target or os.environ.get('RAY_ADDRESS')}: {err}") from None
        gpus = 0 if cfg.device == "cpu" else int(ray.cluster_resources().get("GPU", 0))
        if not gpus and cfg.device and cfg.device.startswith("cuda"):
            self.close()
            raise EvaluatorError(f"device {cfg.device} asked for, but the Ray cluster has no GPU")
        count = min(actors or gpus, gpus) if gpus else actors or cfg.workers
        self._slots = cfg.workers if gpus else 1
        self._options: dict[str, Any] = {"num_gpus": 1} if gpus else {"num_cpus": 1}
        self._device = "cuda:0" if gpus else "cpu"
        with self._lock:
            self._lanes = [self._start_lane() for _ in range(max(1, count))]
        self._await_an_actor()

    # ---- the Pool protocol ----------------------------------------------------------------

    @property
    def width(self) -> int:
        """Evaluations at once over the actors that are up."""
        return max(1, sum(lane.slots for lane in self._lanes))

    def judge(self, task: Task, source: str) -> Verdict:
        for _, verdict in self.judge_many(task, [source]):
            return verdict
        raise AssertionError("judge_many yielded no verdict")  # pragma: no cover

    def judge_many(self, task: Task, sources: Sequence[str]) -> Iterator[tuple[int, Verdict]]:
        """(index into sources, verdict) pairs in the order the verdicts finish."""
        sent = TaskFile.of(task)
        batch = _Batch(deque(range(len(sources))))
        try:
            while batch.queue or batch.running:
                self._dispatch(batch, sent, sources)
                if not batch.running:
                    self._await_a_slot()
                    continue
                for ref in self._await_mine(batch):
                    index, lane = batch.running.pop(ref)
                    verdict = self._outcome(ref, lane, index, batch)
                    if verdict is not None:
                        yield index, verdict
        finally:  # the caller stopped early: running evaluations end on their own
            with self._lock:
                self._abandoned.update((ref, lane) for ref, (_, lane) in batch.running.items()
                                       if ref in lane.running)

    def retire_spares(self) -> None:
        """Nothing to do: each actor's pool keeps its spares until the actor's close()."""

    def close(self) -> None:
        with self._lock:
            lanes, self._lanes = self._lanes, []
            self._abandoned.clear()
        if not ray.is_initialized():  # shut down under us: a call now would start a new Ray
            return
        # An actor's close waits for its evaluations in flight: not while pike is ending.
        cleanups = ([] if unwinding_stop() else
                    [lane.actor.close.remote() for lane in lanes if lane.starting is None])
        if cleanups:
            ray.wait(cleanups, num_returns=len(cleanups), timeout=CLOSE_SECONDS)
        for lane in lanes:
            ray.kill(lane.actor)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- actors ---------------------------------------------------------------------------

    def _start_lane(self) -> _Lane:
        actor = _RemoteActor.options(
            max_concurrency=self._slots + 1,  # a thread beside the evaluations for close()
            **self._options).remote(self.cfg, self._device, self._slots)
        return _Lane(actor, self._slots, starting=actor.where.remote())

    def _await_an_actor(self) -> None:
        """Block until one actor is up, or raise if none can start; the rest join later."""
        deadline = time.monotonic() + START_SECONDS
        while True:
            self._note_started()
            with self._lock:
                if any(lane.starting is None for lane in self._lanes):
                    return
                pings = [lane.starting for lane in self._lanes]
            if not pings or time.monotonic() >= deadline:
                break
            ray.wait(pings, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        self.close()
        why = "; ".join(dict.fromkeys(self._failures)) or (
            f"none started within {START_SECONDS:.0f} s (are the GPUs taken?)")
        if "No module named" in why:
            why += " (every node of the cluster needs pike installed)"
        raise EvaluatorError(f"no evaluation actor could start on the Ray cluster: {why}")

    def _note_started(self) -> None:
        """Mark the actors that have answered as up; drop those that could not start."""
        with self._lock:
            pings = {lane.starting: lane for lane in self._lanes if lane.starting is not None}
        if not pings:
            return
        done, _ = ray.wait(list(pings), num_returns=len(pings), timeout=0)
        for ref in done:
            lane = pings[ref]
            try:
                where, reason = ray.get(ref), ""
            except Exception as err:  # pike missing on that node, CUDA broken there ...
                where, reason = "", _reason(err)
            with self._lock:
                if lane.starting is not ref:
                    continue  # another thread saw it first
                if reason:
                    self._failures.append(reason)
                    self._lanes.remove(lane)
                else:
                    lane.where, lane.starting = where, None
            if reason:
                log.warning("an evaluation actor could not start: %s", reason)
            else:
                log.info("evaluation actor up on %s", where)

    def _lost(self, lane: _Lane, err: BaseException) -> None:
        """Drop an actor that died (or cannot be reached) and start one in its place."""
        with self._lock:
            if lane not in self._lanes:
                return  # already handled, or the pool is closed
            self._lanes.remove(lane)
            for ref in lane.running:
                self._abandoned.pop(ref, None)
            if lane.starting is None:  # it had worked: its replacement likely will too
                self._lanes.append(self._start_lane())
        log.warning("evaluation actor on %s lost (%s); starting another", lane.where,
                    _reason(err))
        ray.kill(lane.actor)  # one that is only unreachable must not go on holding its GPU

    def _reap(self) -> None:
        """Free the slots of finished calls; an abandoned call that found its actor dead
        drops the actor (a call of a live judge_many is its caller's to look at)."""
        with self._lock:
            owner = {ref: lane for lane in self._lanes for ref in lane.running}
        if not owner:
            return
        done, _ = ray.wait(list(owner), num_returns=len(owner), timeout=0)
        with self._lock:
            for ref in done:
                owner[ref].running.discard(ref)
            left = [ref for ref in done if self._abandoned.pop(ref, None) is not None]
        for ref in left:
            try:
                ray.get(ref)
            except _LOST as err:
                self._lost(owner[ref], err)
            except Exception:  # the verdict (or error) of a candidate nobody waits for
                pass

    # ---- placing candidates ---------------------------------------------------------------

    def _dispatch(self, batch: _Batch, sent: TaskFile, sources: Sequence[str]) -> None:
        self._note_started()
        self._reap()
        with self._lock:
            while batch.queue:
                index = batch.queue[0]
                free = [lane for lane in self._lanes if lane.free() > 0]
                if not free:
                    return
                avoid = batch.lost_on.get(index)
                lane = min(free, key=lambda la: (la is avoid, len(la.running)))
                batch.queue.popleft()
                ref = lane.actor.judge.remote(sent, sources[index])
                lane.running.add(ref)
                batch.running[ref] = (index, lane)

    def _await_mine(self, batch: _Batch) -> list[Any]:
        """Wait until a call of this batch finishes (or an actor starts, or a slot frees);
        the batch's finished calls."""
        with self._lock:
            others = [lane.starting for lane in self._lanes if lane.starting is not None]
            others += [ref for lane in self._lanes for ref in lane.running
                       if ref not in batch.running]
        ray.wait(list(batch.running) + others, num_returns=1)
        done, _ = ray.wait(list(batch.running), num_returns=len(batch.running), timeout=0)
        with self._lock:
            for ref in done:
                batch.running[ref][1].running.discard(ref)
        return done

    def _await_a_slot(self) -> None:
        """Nothing of this batch runs and no actor is free: wait for one, or raise."""
        with self._lock:
            if not self._lanes:
                why = "; ".join(dict.fromkeys(self._failures))
                raise EvaluatorError("no evaluation actor is alive on the Ray cluster"
                                     + (f" ({why})" if why else ""))
            pings = [lane.starting for lane in self._lanes if lane.starting is not None]
            busy = [ref for lane in self._lanes for ref in lane.running]
        done, _ = ray.wait(pings + busy, num_returns=1,
                           timeout=None if busy else START_SECONDS)
        if not done:
            raise EvaluatorError(f"no evaluation actor of the Ray cluster started within "
                                 f"{START_SECONDS:.0f} s (are the GPUs taken?)")

    def _outcome(self, ref: Any, lane: _Lane, index: int, batch: _Batch) -> Verdict | None:
        """The candidate's verdict; None where its actor was lost and it is queued again."""
        try:
            return Verdict.model_validate(ray.get(ref))
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, PikeError):
                raise err.cause from None  # the task's own error, as the local pool raises it
            error: BaseException = err  # the actor's own code failed there (a full disk ...)
        except _LOST as err:
            self._lost(lane, err)
            error = err
        first = batch.losses.get(index)
        if first is not None:
            return Verdict(status="crashed", message=(
                f"the evaluation was lost twice: {first}; then {_reason(error)}"))
        batch.losses[index] = _reason(error)
        batch.lost_on[index] = lane
        log.warning("evaluation worker lost (%s on %s); the candidate is queued once more",
                    _reason(error), lane.where)
        batch.queue.appendleft(index)
        return None


def _reason(err: BaseException) -> str:
    """One line: for an actor that failed to start, the error it raised there."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    if lines and "creation task" in lines[0]:
        return f"{type(err).__name__}: {lines[-1].strip()}"[:300]
    return one_line(err)
