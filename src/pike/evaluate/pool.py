"""Evaluation pools: many candidates at once, timing still one at a time per GPU.

A search hands a batch of candidates to a pool and gets each verdict as it is ready. The
local pool runs `evaluate` in worker threads, each evaluation in its own child process as
always: child start-up, imports, extension builds and the warm-up call (where Triton and
torch.compile compile) overlap, while the device lock (device_lock.py) keeps each timed
window alone on its GPU. With several GPUs every GPU is a timing lane and a candidate
goes to the least busy one. The Ray pool (ray_pool.py) does the same across machines.

A worker that dies mid-evaluation (an error of the evaluator or the host, not of the
candidate, whose failures are verdicts) gets its candidate once more, on another worker
where there is one; a second loss gives a `crashed` verdict. Each candidate yields exactly
one verdict, so the caller writes it to the store once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Protocol

from pike.config import EvalConfig
from pike.errors import ConfigError, PikeError
from pike.evaluate import spares
from pike.evaluate.judge import evaluate, resolve_device
from pike.evaluate.leftovers import refuse_new_work_if_ending
from pike.evaluate.reference_cache import keep_references
from pike.evaluate.verdict import Verdict, out_of_device_memory, says_out_of_memory
from pike.task import Task
from pike.threads import unwinding_stop

log = logging.getLogger(__name__)

# The EvalConfig fields that say where evaluations run, not how they are judged: a resumed
# or replayed run may take new ones (another machine) without changing its verdicts.
PLACEMENT = ("workers", "devices", "cluster", "ray_address")


class Pool(Protocol):
    """What searches need from an evaluator: one verdict, or many as they finish."""

    @property
    def width(self) -> int:
        """How many evaluations it runs at once."""
        ...

    def judge(self, task: Task, source: str) -> Verdict: ...

    def judge_many(self, task: Task, sources: Sequence[str]) -> Iterator[tuple[int, Verdict]]:
        """(index into sources, verdict) pairs in the order the verdicts finish."""
        ...

    def close(self) -> None: ...

    def retire_spares(self) -> None:
        """Its search sends nothing more: children launched ahead of candidates go now."""
        ...


def requeue_once(attempt: Callable[[int], Verdict],
                 lost: Callable[[BaseException], bool]) -> Verdict:
    """`attempt(0)`, and where its worker was lost (`lost(error)`), `attempt(1)` (the
    caller places it elsewhere); a second loss is the candidate's `crashed` verdict."""
    try:
        return attempt(0)
    except Exception as first:
        if not lost(first):
            raise
        log.warning("evaluation worker lost (%s); the candidate is queued once more",
                    one_line(first))
        try:
            return attempt(1)
        except Exception as second:
            if not lost(second):
                raise
            return Verdict(status="crashed", message=(
                f"the evaluation was lost twice: {one_line(first)}; then {one_line(second)}"))


def one_line(err: BaseException | str) -> str:
    """An error (or an error's message) as one short line, for verdicts and logs."""
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return (first if isinstance(err, str) else f"{type(err).__name__}: {first}")[:300]


def _evaluator_failure(err: BaseException) -> bool:
    # PikeError covers the task's own failures (TaskError: the reference is broken) and
    # config errors: deterministic, so running them again cannot help.
    return not isinstance(err, PikeError)


def _judged(executor: ThreadPoolExecutor | None, judge: Callable[[str], Verdict],
            sources: Sequence[str]) -> Iterator[tuple[int, Verdict]]:
    """(index, verdict) pairs as they finish: on `executor`'s threads, or one after another
    in this thread where there is none or one source (tracebacks stay simple)."""
    if executor is None or len(sources) <= 1:
        for i, source in enumerate(sources):
            yield i, judge(source)
        return
    futures: dict[Future[Verdict], int] = {
        executor.submit(judge, s): i for i, s in enumerate(sources)}
    try:
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:  # the caller stopped early (an error, Ctrl-C): drop what has not started
        for future in futures:
            future.cancel()


# The pool's own steps, outside a verdict's `total` (below); offline._stood reads them.
WAIT_IN_POOL, CROWDED_TRY = "wait_in_pool", "crowded_try"
POOL_STEPS = (WAIT_IN_POOL, CROWDED_TRY)


def _with_steps(verdict: Verdict, **seconds: float) -> Verdict:
    """The verdict with the pool's own steps added: the time a candidate was held back
    before its child started (`wait_in_pool`: behind a second try given room) and a
    first try that ran out of memory beside others (`crowded_try`). Neither is the
    candidate's work; a search's budget does not count them (offline._stood)."""
    kept = {name: s for name, s in seconds.items() if s >= 0.001}
    if not kept:
        return verdict
    steps = dict(verdict.steps)
    for name, s in kept.items():
        steps[name] = round(steps.get(name, 0.0) + s, 3)
    return verdict.model_copy(update={"steps": steps})


class LocalPool:
    """Evaluations in `workers` threads on this host, over `devices` (GPUs or 'cpu')."""

    def __init__(self, cfg: EvalConfig, workers: int | None = None,
                 devices: Sequence[str] | None = None,
                 evaluator: Callable[[Task, str, EvalConfig], Verdict] = evaluate) -> None:
        self.cfg = cfg
        self.workers = max(1, workers if workers is not None else cfg.workers)
        names = list(devices if devices is not None else cfg.devices) or [cfg.device]
        self.devices = [resolve_device(d) for d in names]
        self._busy = dict.fromkeys(self.devices, 0)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._draining = dict.fromkeys(self.devices, 0)  # candidates waiting for room
        # per device, the room of each second try running there: how many may be beside it
        self._capped: dict[str, list[int]] = {d: [] for d in self.devices}
        self._evaluate = evaluator
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="pike-eval")
        keep_references(self.workers + 1)  # a live reference child per task in flight
        # a child per worker launched ahead of its candidate (the evaluator's own children)
        self._spares = self.workers if evaluator is evaluate else 0
        spares.want(self._spares)

    @property
    def width(self) -> int:
        return self.workers

    def judge(self, task: Task, source: str) -> Verdict:
        return self._run(task, source)

    def judge_many(self, task: Task, sources: Sequence[str]) -> Iterator[tuple[int, Verdict]]:
        yield from _judged(self._executor if self.workers > 1 else None,
                           lambda s: self._run(task, s), sources)

    def close(self) -> None:
        # On a Ctrl-C (or an exit) nothing waits for the evaluations in flight: the CLI ends them.
        self._executor.shutdown(wait=not unwinding_stop(), cancel_futures=True)
        self.retire_spares()

    def retire_spares(self) -> None:
        # A spare launched after the last candidate had waited for pool.close(), through
        # the confirming window: on a CPU host its torch import ran beside that window's
        # loads, for nothing, and on a GPU host it held a child's host memory.
        spares.want(-self._spares)
        self._spares = 0

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, task: Task, source: str) -> Verdict:
        used: list[str] = []
        crowded: list[bool] = []

        room: list[int] = []  # the retry after running out of memory beside others
        waited = [0.0]  # seconds held back in _take, before any try
        started: list[float] = []  # when each try's evaluation began

        def attempt(n: int) -> Verdict:
            beside = room[0] if room else None
            asked = time.monotonic()
            device = self._take(avoid=used, beside=beside)
            started.append(time.monotonic())
            waited[0] += started[-1] - asked
            used.append(device)
            try:
                verdict = self._evaluate(task, source,
                                         self.cfg.model_copy(update={"device": device}))
                with self._lock:
                    crowded.append(device.startswith("cuda") and self._busy[device] > 1)
                return verdict
            finally:
                self._give(device, beside)

        verdict = requeue_once(attempt, _evaluator_failure)
        if crowded and crowded[-1] and out_of_device_memory(verdict):
            # The GPU ran out with other evaluations on it: their memory is not this
            # candidate's fault. Judged once more, with room: at most half the pool's
            # evaluations beside it (an H200 level2 bench had both tries of a 1 GB-a-trial
            # candidate run out beside 16 to 20 others); a candidate that needs more than
            # the card runs out again and keeps its verdict.
            # what ran out, in the log: the GPU's allocator names its card and what
            # was free, the host's memory watch the child tree's size
            said = next((line.strip() for line in (verdict.message or "").splitlines()
                         if says_out_of_memory(line)), "")
            room[:] = [self._per_device() // 2]
            log.warning("%s: a candidate ran out of memory (the GPU's, or the host's) with "
                        "other evaluations on the GPU, in phase %s; judged once more, with "
                        "at most %d beside it (%s)",
                        task.name, verdict.phase, room[0], one_line(said))
            crowded_try = time.monotonic() - started[-1]  # (a lost try before it counts)
            verdict = requeue_once(attempt, _evaluator_failure)
            if not out_of_device_memory(verdict):
                # out again with room: it needs more than the card, and its first try was
                # its own cost, not its neighbours'
                verdict = _with_steps(verdict, **{CROWDED_TRY: crowded_try})
        return _with_steps(verdict, **{WAIT_IN_POOL: waited[0]})

    def _per_device(self) -> int:
        """The evaluations a device holds when the pool is full."""
        return -(-self.workers // len(self.devices))

    def _take(self, avoid: Sequence[str], beside: int | None = None) -> str:
        """The least busy device, preferring one this candidate has not been lost on; with
        `beside`, once at most that many evaluations are on it, and from then until it
        ends (`_give`) no more than that many beside it. While such a candidate waits, no
        other starts on its device: the device drains to make its room."""
        with self._room:
            device = min(self.devices, key=lambda d: (d in avoid, self._draining[d] > 0,
                                                      bool(self._capped[d]), self._busy[d]))
            if beside is not None:
                self._draining[device] += 1
                try:
                    while self._busy[device] > min([beside, *self._capped[device]]):
                        refuse_new_work_if_ending()  # pike ends: wait for nothing
                        self._room.wait(timeout=1.0)
                finally:
                    self._draining[device] -= 1
                    self._room.notify_all()  # the candidates it held back
            else:
                # behind a drain, and beside a second try given room, until it ends
                while (self._draining[device] or self._capped[device]
                       and self._busy[device] > min(self._capped[device])):
                    refuse_new_work_if_ending()
                    self._room.wait(timeout=1.0)
            refuse_new_work_if_ending()  # (a wait may have ended for it)
            self._busy[device] += 1
            if beside is not None:
                self._capped[device].append(beside)
            return device

    def _give(self, device: str, beside: int | None = None) -> None:
        with self._room:
            self._busy[device] -= 1
            if beside is not None:
                self._capped[device].remove(beside)
            self._room.notify_all()


class Lane:
    """One task's share of a pool that several tasks use at once: at most `width` of its
    candidates in evaluation at a time. Through the pool's own queue, the task that
    batched first would hold the others back while their time budgets ran."""

    def __init__(self, pool: Pool, width: int) -> None:
        self.pool = pool
        self._width = max(1, width)

    @property
    def width(self) -> int:
        return self._width

    def judge(self, task: Task, source: str) -> Verdict:
        return self.pool.judge(task, source)

    def judge_many(self, task: Task, sources: Sequence[str]) -> Iterator[tuple[int, Verdict]]:
        if self._width == 1 or len(sources) <= 1:
            yield from _judged(None, lambda s: self.pool.judge(task, s), sources)
            return
        lane = ThreadPoolExecutor(min(self._width, len(sources)), thread_name_prefix="pike-lane")
        try:
            yield from _judged(lane, lambda s: self.pool.judge(task, s), sources)
        finally:
            lane.shutdown(wait=not unwinding_stop())

    def close(self) -> None:
        """The pool is its owner's to close."""


def make_pool(cfg: EvalConfig) -> Pool:
    """The pool the config asks for: local threads, or Ray actors (`cluster: ray`)."""
    if cfg.cluster == "local":
        return LocalPool(cfg)
    try:
        from pike.evaluate.ray_pool import RayPool
    except ImportError as err:
        raise ConfigError("the Ray backend needs Ray: pip install 'ray>=2.9' (pike's "
                          f"[ray] extra) ({err})") from None
    return RayPool(cfg)
