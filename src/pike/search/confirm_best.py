"""The confirming window of a search's end: its top candidates and eager timed again in one
window (evaluate/confirm.py), kept in the store, and what the window caught."""

from __future__ import annotations

import logging
from typing import Any

from pike.config import RunConfig, SearchConfig
from pike.errors import TaskError
from pike.evaluate import host_memory
from pike.evaluate.pool import one_line
from pike.evaluate.reference_cache import close_idle_references
from pike.evaluate.verdict import says_out_of_memory
from pike.search.baseline_modes import fastest_mode
from pike.search.drain import due
from pike.store import BASELINE_STATE, RunStore
from pike.task import Task

log = logging.getLogger(__name__)


def confirm_best(store: RunStore, task: Task, cfg: RunConfig) -> None:
    """Time the search's top candidates and eager again in one window (evaluate/confirm.py)
    and keep the figures in the store; a resumed run with the same top keeps them."""
    mode = fastest_mode(store.get_state(task.name, BASELINE_STATE))
    top = confirm_candidates(store.candidates(task.name), cfg.search, mode)
    if not top:
        return
    top = _as_many_as_fit(task, top, mode)
    ids = [r.id for r in top]
    kept = store.get_state(task.name, "confirmed")
    if isinstance(kept, dict) and kept.get("candidates") == ids:
        return
    from pike.evaluate.confirm import confirm

    sources = {r.id: r.source for r in top}
    searched = {r.id: r.verdict.speedup or 0.0 for r in top}
    found = confirm(task, sources, cfg.eval)
    failed = _failed_above_the_best(found, searched)
    if any(says_out_of_memory(c.error) for c in found) and not due():
        # its children were loaded beside other evaluations: one window more, as a
        # candidate that ran out in a crowded pool is judged once more
        log.warning("%s: a confirmed candidate ran out of memory (the GPU's, or the host's); "
                    "the window is timed once more", task.name)
        found = confirm(task, sources, cfg.eval)
    elif failed and not due():
        # Judged correct and faster in its own window, it failed in this one: on the H100
        # pike's own compile:default (2.38x) crashed there beside three other tasks, its
        # message cut short, and a 1.27x file became the task's best. A window more.
        log.warning("%s: candidate %d failed in the confirming window (%s); the window is "
                    "timed once more", task.name, failed[0], _error_line(failed[1]))
        found = confirm(task, sources, cfg.eval)
    found = _alone_where_memory_ran_out(task, sources, searched, found, cfg)
    _keep_what_the_window_caught(store, task, found)
    store.set_state(task.name, "confirmed", {"candidates": ids,
                                             "figures": [c.model_dump() for c in found]})
    failed = _failed_above_the_best(found, searched)
    if failed:
        best = store.best(task.name)  # as every reader of the store will see it
        after = ("no candidate is left" if best is None or best.verdict is None
                 else f"the best is the fastest one confirmed ({best.id})"
                 if best.verdict.confirmed
                 else f"no candidate was confirmed: the search's own figures stand ({best.id})"
                 if not any(c.speedup for c in found)
                 else "the window could not rank it for want of memory: the search's own "
                 f"figures stand ({best.id})")
        log.warning("%s: candidate %d (%.2fx in its search window) failed in the confirming "
                    "window (%s); %s", task.name, failed[0], searched[failed[0]],
                    _error_line(failed[1]), after)


def _as_many_as_fit(task: Task, top: list[Any], mode: str | None) -> list[Any]:
    """The window's candidates, as many as the host has room for beside its reference
    by what the task's own children took (host_memory.room_for): the search's best first,
    and pike's candidate of the fastest compile mode kept while two fit. The window loads
    them all at once and waits for no memory: on the H100's level1 bench,
    7_Matmul_with_small_K's (a 38 GB reference, 27 GB candidates) was killed by the
    host's out-of-memory killer twice."""
    # its search's reference, kept idle by the cache, is not the window's (a fresh draw)
    close_idle_references(of=task)
    room = host_memory.HOST.room_for(task.sha256, len(top))
    if room >= len(top):
        return top
    kept = top[:room]
    floor = next((r for r in top if mode and r.role == "offline" and r.idea == mode), None)
    if floor is not None and floor not in kept and room >= 2:
        kept = [*top[:room - 1], floor]
    log.warning("%s: the confirming window takes %d of its %d candidates: the host has "
                "room for that many beside the reference, by what its children took",
                task.name, len(kept), len(top))
    return kept


def _alone_where_memory_ran_out(task: Task, sources: dict[int, str],
                                searched: dict[int, float], found: list[Any],
                                cfg: RunConfig) -> list[Any]:
    """Each candidate that ran out of memory in the window although its search figure is
    above the confirmed best's, timed once more beside eager alone.

    The window holds the reference and every candidate at once. On the H100's level1
    bench (bench-level1-h100), 7_Matmul_with_small_K's max-autotune file (1.18x in its
    search window) was killed by the host's out-of-memory killer in both windows beside a
    CUDA-graph file at 0.59x, and 42_Max_Pooling_2D's (2.48x) ran out of GPU memory
    beside one at 0.80x: each slower file became its task's best, below eager. Alone,
    the window holds one candidate's memory instead of several. Where it runs out again,
    RunStore.best leaves the task to the search's own figures."""
    from pike.evaluate.confirm import confirm, fastest_first

    tried: set[int] = set()
    while len(sources) > 1 and not due():
        failed = _failed_above_the_best(found, searched, memory_only=True, skip=tried)
        if failed is None:
            break
        cid = failed[0]
        tried.add(cid)
        log.warning("%s: candidate %d ran out of memory in a confirming window of %d "
                    "candidates; timed once more beside eager alone", task.name, cid,
                    len(sources))
        try:
            alone = confirm(task, {cid: sources[cid]}, cfg.eval)
        except TaskError as err:  # its fresh reference failed (out of memory, say): the
            # crowded window's figures stay, and the store reads the failure as before
            log.warning("%s: the window of candidate %d alone could not be timed (%s)",
                        task.name, cid, _error_line(str(err)))
            continue
        alone = [c.model_copy(update={"alone": True}) for c in alone]
        found = sorted([*(c for c in found if c.candidate_id != cid), *alone],
                       key=fastest_first)
    return found


def _keep_what_the_window_caught(store: RunStore, task: Task, found: list[Any]) -> None:
    """A candidate whose trials (on inputs the search never drew) or timed calls (wrong
    sampled outputs, reused answers) were caught in the confirming window gets that
    verdict in the store, in place of its search
    window's `ok`: a file that told the two windows apart must not come back as the
    task's best by its search figure where no other candidate was confirmed."""
    for confirmation in found:
        if not confirmation.caught:
            continue
        row = store.candidate(confirmation.candidate_id)
        if row.verdict is None:
            continue
        log.warning("%s: candidate %d was caught in the confirming window (%s)", task.name,
                    confirmation.candidate_id, _error_line(confirmation.error))
        store.set_verdict(confirmation.candidate_id, row.verdict.model_copy(update={
            "status": confirmation.caught, "phase": confirmation.caught_in, "speedup": None,
            "runtime": None, "message": "in the confirming window: " + confirmation.error}))


def _failed_above_the_best(found: list[Any], searched: dict[int, float], *,
                           memory_only: bool = False, skip: set[int] | frozenset[int] = frozenset()
                           ) -> tuple[int, str] | None:
    """Of the candidates that failed in the confirming window although their search-time
    figure is above that of the confirmed best (or any, where none was confirmed), the
    one with the highest: a failure that changes which file is the task's best. One a
    guard caught is left out: another window would not undo it. `memory_only`: of those
    that ran out of memory (a crash above them does not hide them); `skip`: not these."""
    best = next((searched.get(c.candidate_id, 0.0) for c in found if c.speedup), 0.0)
    above = [c for c in found if not c.speedup and not c.caught
             and c.candidate_id not in skip
             and (not memory_only or says_out_of_memory(c.error))
             and searched.get(c.candidate_id, 0.0) > best]
    first = max(above, key=lambda c: searched.get(c.candidate_id, 0.0), default=None)
    return (first.candidate_id, first.error) if first else None


def _error_line(message: str) -> str:
    """A failure's first line and, where it goes on, its last (a child's message ends with
    its error, after its stderr's traceback)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return one_line(message)
    return f"{one_line(lines[0])} ... {one_line(lines[-1])}"


def confirm_candidates(rows: list[Any], cfg: SearchConfig, mode: str | None = None
                       ) -> list[Any]:
    """Which candidates the confirming window takes: the `confirm_top` best by search-time
    speedup, and any other within `confirm_within` of the best, `confirm_max` at most;
    and the offline candidate of `mode` (the task's fastest torch.compile mode in its
    baseline, `fastest_mode`) wherever the search judged it correct, whatever its
    figure there. In its own window beside other searches a compile mode can measure
    far below what it does alone (max-autotune's kernels picked in a busy pool ran 22%
    slower, contamination-h200-alone.md), and the offline level3-pike set audited alone
    had 17 files below their task's fastest mode (the CNNs' CUDA graphs around eager at
    0.69x to 0.86x of reduce-overhead). Timed in the same window as the search's best, the mode is the best where it is
    faster, so a search's result is not below the mode alone. It comes on top of
    `confirm_max`; where nothing is rankable there is no window at all. Only pike's own
    rendering of the mode (role 'offline'): a window checks less than a verdict, and such
    a file is the reference wrapped in torch.compile."""
    ranked = sorted((r for r in rows if r.role != "reference" and r.verdict is not None
                     and r.verdict.rankable and r.verdict.speedup),
                    key=lambda r: (-(r.verdict.speedup or 0.0), r.id))
    if not ranked or cfg.confirm_top == 0:
        return []
    near = (1.0 - cfg.confirm_within) * ranked[0].verdict.speedup
    chosen = [r for i, r in enumerate(ranked)
              if i < cfg.confirm_top or r.verdict.speedup >= near]
    chosen = chosen[:max(cfg.confirm_top, cfg.confirm_max)]
    # one beyond confirm_max; a window cut short behind the best counts, a hopeless one not
    floor = next((r for r in rows if mode and r.role == "offline" and r.idea == mode
                  and r.verdict is not None and r.verdict.comparable), None)
    if floor is not None and all(r.id != floor.id for r in chosen):
        chosen.append(floor)
    return chosen


