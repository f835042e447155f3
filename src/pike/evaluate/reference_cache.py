"""The reference runs kept by task and protocol: made outside the cache's lock (several
tasks at once), run once more after running out of memory beside other evaluations,
closed when a child waits for host memory, and closed at exit.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict

from pike.config import EvalConfig
from pike.errors import TaskError
from pike.evaluate import host_memory
from pike.evaluate.leftovers import at_exit_uninterrupted, refuse_new_work_if_ending
from pike.evaluate.reference import ReferenceRun
from pike.evaluate.reference_failure import ReferenceOutOfMemory
from pike.evaluate.reference_start import _CHILD_PROTOCOL, _start_reference
from pike.evaluate.steps import current as current_steps
from pike.evaluate.steps import measuring
from pike.task import Task

log = logging.getLogger(__name__)

_REFERENCE_CACHE_SIZE = 2
_references: OrderedDict[str, ReferenceRun] = OrderedDict()
_references_lock = threading.Lock()  # evaluations of several tasks run in threads (bench)
# Reference runs being made, by cache key (_Making: done once the run is in the cache or
# has failed). Each is made outside the lock, so several tasks' references are made at once.
_making: dict[str, _Making] = {}
_exiting = False  # close_references(at_once): a run made after it is closed at once


def close_references(at_once: bool = False) -> None:
    """Stop every cached reference child (also run at interpreter exit)."""
    global _exiting
    with _references_lock:
        _exiting = _exiting or at_once
        while _references:
            run = _references.popitem()[1]
            if at_once and run.child is not None:
                run.child.unresponsive = True  # killed, not asked: it may be mid-request
            run.close()


at_exit_uninterrupted(close_references, at_once=True)  # at exit, no waiting for answers


def run_reference(task: Task, cfg: EvalConfig, device: str, *, keep_child: bool,
                  cache: bool = True) -> ReferenceRun:
    """Run (or reuse) the task's reference: trial inputs, expected outputs, a live child.
    One that ran out of GPU memory runs once more, after a wait outside the cache's lock."""
    try:
        return _run_or_reuse(task, cfg, device, keep_child, cache)
    except ReferenceOutOfMemory:
        refuse_new_work_if_ending()  # pike's own exit killed it: no wait, no second run
        log.warning("%s: the reference ran out of memory (the GPU's, or the host's); run "
                    "once more in %.0f s (other evaluations may have held it)", task.name,
                    _OUT_OF_MEMORY_WAIT_S)
    _wait(_OUT_OF_MEMORY_WAIT_S)
    return _run_or_reuse(task, cfg, device, keep_child, cache)


def _reference_protocol(cfg: EvalConfig) -> str:
    """What a reference run is made with, as its cache key: timing too, since the child
    times the reference with the settings it was started with, less `min_seconds`, which
    each block's request carries, and `rounds`, which the child never reads (the parent's
    timing_window.time_interleaved does): a search's screening windows (search.screen_seconds,
    screen_rounds) and its confirming window time the same reference child. Other fields
    only the parent reads stay in the key: needless there, but harmless."""
    protocol = cfg.model_dump(mode="json",
                              include={*_CHILD_PROTOCOL, "limits", "seed", "sandbox"})
    protocol["timing"].pop("min_seconds", None)
    protocol["timing"].pop("rounds", None)
    return json.dumps(protocol, sort_keys=True)


def _run_or_reuse(task: Task, cfg: EvalConfig, device: str, keep_child: bool,
                  cache: bool) -> ReferenceRun:
    key = "|".join([task.sha256, device, _reference_protocol(cfg), str(keep_child)])
    if not cache:
        return _start_reference(task, cfg, device, keep_child)
    mine: _Making | None = None
    try:
        while True:
            with _references_lock:
                cached = _references.get(key)
                if cached is not None and cached.usable():
                    _references.move_to_end(key)
                    cached.users += 1
                    return cached
                making = _making.get(key)
                if making is None:
                    if cached is not None:
                        _references.pop(key).close()
                    # idle ones beyond the cache's size go first, so the new child finds
                    # their memory free
                    idle = [k for k, run in _references.items() if run.users == 0]
                    for old in idle[:max(0, len(_references) + len(_making) + 1
                                         - _REFERENCE_CACHE_SIZE)]:
                        _references.pop(old).close()
                    mine = _making[key] = _Making()
                    break
            # Made by another evaluation of the task: in the cache once it is set. Its
            # failure is this one's too (one out of memory is tried again by each caller's
            # run_reference, after its wait); where it was interrupted, this one tries.
            making.done.wait()
            if isinstance(making.error, TaskError):
                raise making.error
        # Made outside the lock: under it, on the H200 level2 bench, the references of the
        # tasks a resumed run took up again were made one after another, and the first
        # candidates of the last ones waited 100 s each. Outside it, a reference waits for
        # host memory as a candidate does (under it, it was counted at once: a wait there
        # would have held every task's evaluations).
        run = _made_reference(task, cfg, device, keep_child)
        with _references_lock:
            _references[key] = run
            run.users += 1
            if _exiting:  # close_references(at_once) ran meanwhile: pike is ending
                _references.pop(key).close()
                raise KeyboardInterrupt("pike is ending")
        return run
    except BaseException as err:
        if mine is not None:
            mine.error = err
        raise
    finally:
        if mine is not None:
            with _references_lock:
                if _making.get(key) is mine:
                    del _making[key]
            mine.done.set()


class _Making:
    """A reference run being made: `done` once it is in the cache or has failed (`error`)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


def _made_reference(task: Task, cfg: EvalConfig, device: str, keep_child: bool
                    ) -> ReferenceRun:
    """`_start_reference`, its steps added to the evaluation's that asked, its wait for
    host memory as `reference.wait_for_memory`: the evaluation's `reference` step already
    holds it, and a budget that leaves both out would count it twice."""
    spans: dict[str, float] = {}
    try:
        with measuring() as made:
            spans = made.spans  # filled as the reference is made
            return _start_reference(task, cfg, device, keep_child)
    finally:
        waited = spans.pop("wait_for_memory", 0.0)
        clock = current_steps()  # the asking evaluation's again
        clock.merge(spans)
        if waited:
            clock.add("reference.wait_for_memory", waited)


def _close_an_idle_reference() -> bool:
    """Close the least recently used cached reference no evaluation uses (a child waiting
    for host memory asks); whether there was one. Kept ones are kept for speed only: with
    one per task begun, idle ones held room a reference or candidate waited for."""
    with _references_lock:
        key = next((k for k, run in _references.items() if run.users == 0), None)
        if key is None:
            return False
        run = _references.pop(key)
    log.info("an idle reference child closed: a child waits for host memory")
    run.close()  # outside the lock: it waits for the child to end
    return True


host_memory.HOST.reclaim_with(_close_an_idle_reference)


def close_idle_references(device: str | None = None, *, of: Task | None = None) -> int:
    """Close the cached references no evaluation uses: those on `device` (any where None),
    of task `of` only (every task's where None); how many were closed. A kept child holds
    its model on the GPU: on an H100 audit of level5, 12_deepseekv3_MLA_decode's idle
    reference (its KV caches) was still there when 14_llama2_decode's candidate was
    built, and that candidate ran out of GPU memory. Those are kept for speed only."""
    def matches(key: str, run: ReferenceRun) -> bool:
        return (run.users == 0 and (device is None or run.device == device)
                and (of is None or key.split("|", 1)[0] == of.sha256))

    with _references_lock:
        closing = [_references.pop(k) for k, run in list(_references.items()) if matches(k, run)]
    for run in closing:  # outside the lock: each waits for its child to end
        run.close()
    return len(closing)


def keep_references(count: int) -> None:
    """Keep at least `count` idle reference children alive (one per concurrent task)."""
    global _REFERENCE_CACHE_SIZE
    _REFERENCE_CACHE_SIZE = max(_REFERENCE_CACHE_SIZE, count)


def release_reference(run: ReferenceRun) -> None:
    with _references_lock:
        run.users = max(0, run.users - 1)


def count_work_meanwhile(reference: ReferenceRun) -> None:
    """Count the task's work (for the floor) in the reference's child while the candidate's
    child starts, where it needs no GPU memory: a first count takes seconds, and the
    reference's child is idle then. One that would build the model again on the GPU
    waits for the verdict (`ReferenceRun.work`), so it does not take the memory of the
    candidate starting beside it (a pool's other candidates on the card may still meet it).
    The run is held (`users`) until the count ends, so no cache evicts it meanwhile."""
    if reference._work_asked or reference._work_needs_gpu or reference.child is None:
        return  # asked, or known to need the GPU: the verdict's floor counts it
    with _references_lock:
        reference.users += 1

    def count() -> None:
        try:
            reference.work(without_gpu=True)  # a second model on the GPU waits for the verdict
        except Exception as err:  # a child closed at exit: the floor is advisory
            log.debug("work count in the background failed: %s", err)
        finally:
            release_reference(reference)

    threading.Thread(target=count, name="pike-work-count", daemon=True).start()


# A reference that ran out of GPU memory beside other evaluations (a campaign's other
# tasks, their candidates) runs once more after this wait: their memory is not the task's
# fault, and one that needs more than the card runs out again and fails its task.
_OUT_OF_MEMORY_WAIT_S = 15.0
_wait = time.sleep
