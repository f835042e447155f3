"""`pike export`: a run's best solution as a module that says what it is."""

from __future__ import annotations

from pathlib import Path

from pike.errors import PikeError
from pike.store import RunStore


def export_best(store: RunStore, task: str | None, out: Path) -> Path:
    """Write the best correct candidate of `task` to `out`, with a header on its verdict."""
    names = [t["name"] for t in store.tasks()]
    if task is None:
        if len(names) != 1:
            raise PikeError(f"the run has {len(names)} tasks; name one of: {', '.join(names)}")
        task = names[0]
    if task not in names:
        raise PikeError(f"no task {task!r} in the run; it has: {', '.join(names)}")
    best = store.best(task)
    if best is None or best.verdict is None:
        raise PikeError(f"{task}: the run has no correct candidate to export")
    v = best.verdict
    runtime = f"{v.runtime.median_ms:.4g} ms" if v.runtime else "not timed"
    reference = f"{v.reference.median_ms:.4g} ms" if v.reference else "not timed"
    speedup = f"{v.speedup:.2f}x over eager" if v.speedup else "speedup unknown"
    header = "\n".join([
        f"# pike solution for {task} (candidate {best.id} of {store.path.parent})",
        f"# verdict: {v.status}, {v.trials_passed}/{v.trials} trials within tolerance "
        f"(max abs error {v.max_abs_error if v.max_abs_error is not None else '-'})",
        f"# speedup: {speedup} (median {runtime}, reference {reference})",
        f"# device: {v.device} {v.device_name}, torch {v.torch_version}, host {v.host}",
        f"# judged: {best.created_at}; origin: {best.role}"
        + (f" ({best.idea})" if best.idea else ""),
        "# Re-check on your machine: pike eval TASK_FILE THIS_FILE", "",
    ])
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(header + "\n" + best.source)
    except OSError as err:
        raise PikeError(f"cannot write {out}: {err.strerror}") from None
    return out
