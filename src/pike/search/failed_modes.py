"""A resumed run's memory (an audit's, a `pike bench` campaign's) of the compile modes that
failed to build in its earlier calls.

A task's baselines are measured whole in one call: a call cut off in them measures them
again from the start in the next. Where each mode takes minutes to fail (a build past
its limit), that start never ends; the failures, recorded as they come, are kept failed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from pike.evaluate.baseline import ModeTiming
from pike.evaluate.verdict import says_out_of_memory
from pike.search import drain
from pike.store import RunStore
from pike.task import Task

# A task's compile modes that failed to build, as they fail: {mode: {error, build_s, call}}
FAILED_MODES_STATE = "failed_modes"
# This call's mark: a mode that failed in it (beside other work, say) is built again by a
# later measurement in the same call, as before; only earlier calls' failures are kept
_THIS_CALL = f"{os.getpid()}@{time.time():.3f}"


def keeping_failed_modes(store: RunStore, task: Task,
                          event: Callable[..., None]) -> Callable[..., None]:
    """`event`, which also records in the store each compile mode that fails to build (but
    for want of GPU memory, which other work may have held), as it fails: a call cut off
    later in the task's baselines keeps it (`failed_modes`)."""
    def on_event(kind: str, **data: Any) -> None:
        error, mode = data.get("error"), data.get("mode")
        if (kind == "mode_built" and error and isinstance(mode, str)
                and mode.startswith("compile:") and not says_out_of_memory(str(error))):
            failed = store.get_state(task.name, FAILED_MODES_STATE) or {}
            assert isinstance(failed, dict)
            failed[mode] = {"error": str(error), "build_s": data.get("build_s"),
                            "call": _THIS_CALL}
            store.set_state(task.name, FAILED_MODES_STATE, failed)
        event(kind, **data)

    return on_event


def failed_modes(store: RunStore, task: Task) -> dict[str, ModeTiming]:
    """The compile modes that failed to build in an earlier call of this run, not built
    again: on an H100, 6_hunyuanvideo_vae_encoder's compile:default ran 300 s to its build
    limit, and the task's baselines began again in each device call of 600 s.
    `--fill-baselines` and `--redo` forget them (with all the task recorded)."""
    failed = store.get_state(task.name, FAILED_MODES_STATE) or {}
    assert isinstance(failed, dict)
    return {mode: ModeTiming(mode=mode, build_s=got.get("build_s"),
                             error=f"{got.get('error')} (in an earlier call of this run; "
                             "not built again)")
            for mode, got in failed.items() if got.get("call") != _THIS_CALL}


def resumable_baselines(store: RunStore, task: Task,
                        event: Callable[..., None]) -> dict[str, Any]:
    """`measure_baselines`' keywords for a run that resumes across calls (an audit, a
    `pike bench` campaign): its events record each mode that fails to build, earlier
    calls' failures are kept, and a drain (Ctrl-C) stops it between modes."""
    return {"on_event": keeping_failed_modes(store, task, event),
            "stopped": drain.interrupted, "failed_before": failed_modes(store, task)}
