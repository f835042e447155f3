"""Solution sets: the best correct candidate of each task of a run, as plain files plus a
`manifest.json` that says what each file is and what was measured for it.

A set is what `pike export RUN_DIR --set DIR` writes and what `pike audit` re-judges:

    DIR/
      manifest.json        format, version, per task: file, task sha256, verdict, speedups
      1_GeluMLP.py         the candidate's source exactly as judged (no header added)
      ...

Every task of the run has an entry, solved or not: a task without a correct candidate is
listed with its status and no file, so a set can never look better by leaving tasks out.
The set's own figure, `claimed_geomean`, is the geomean over ALL its tasks of the speedup
over eager, with every task that has no file counting 1.0x (CLAIMED_METHOD); an audit
compares it with what it measures.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pike.errors import ConfigError
from pike.evaluate.baseline import Baseline
from pike.evaluate.verdict import slower_than_eager
from pike.report.data import geomean, stored_baseline
from pike.store import ERROR_STATE, MISSING_STATE, CandidateRow, RunStore
from pike.task import safe_file_stems

MANIFEST = "manifest.json"
SET_FORMAT = "pike-solution-set"
# 2 added the status `slower`; a set without such an entry is still written as 1 (see
# new_manifest), so the pike that wrote the committed sets before it still reads them.
SET_VERSION = 2
CLAIMED_METHOD = ("geomean over all tasks of the set of the best correct candidate's speedup "
                  "over eager; a task without a correct candidate counts 1.0x")

# ok: a file with a correct, timed candidate. slower: the fastest correct candidate was
# slower than eager, so the reference is kept and no file is written (detail gives its
# figure). failed: candidates were judged, none correct and timed (detail counts their
# statuses). no_candidates: nothing judged. missing: an audit found no file for the task.
# error: the task's reference itself failed.
EntryStatus = Literal["ok", "slower", "failed", "no_candidates", "missing", "error"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SetEntry(_Strict):
    """One task of a set."""

    task: str = Field(description="the task's name (its file name without .py)")
    task_sha256: str = Field(description="sha256 of the task file the candidate was judged on")
    file: str | None = Field(None, description="the solution's file name in the set; None "
                             "when the task has no correct candidate")
    file_sha256: str | None = None
    status: EntryStatus
    detail: str = Field("", description="why there is no file (verdict counts, the error)")
    speedup_vs_eager: float | None = None
    compile_speedups: dict[str, float] = Field(
        default_factory=dict, description="torch.compile mode -> the candidate's speedup over "
        "that mode (its speedup over eager / the mode's); only when the run has a baseline")
    trials_passed: int | None = None
    trials: int | None = None
    device: str = ""
    device_name: str = ""
    torch_version: str = ""
    date: str = Field("", description="when the candidate was recorded (ISO 8601, UTC)")
    candidate_id: int | None = None
    source_run: str = Field("", description="the run folder of candidate_id (a set kept "
                            "task by task may hold entries of several runs)")


class SolutionSet(_Strict):
    """A set's manifest.json."""

    format: Literal["pike-solution-set"] = SET_FORMAT
    version: int = SET_VERSION
    created_at: str
    source_run: str = Field("", description="the run folder the set was exported from; "
                            "empty where its entries come from several (see each entry's)")
    claimed_geomean: float
    claimed_geomean_method: str = CLAIMED_METHOD
    tasks: list[SetEntry]

    def entry(self, task: str) -> SetEntry | None:
        return next((e for e in self.tasks if e.task == task), None)

    def modified_files(self, folder: Path) -> list[str]:
        """Files whose content is no longer what the manifest recorded."""
        return [e.file for e in self.tasks if e.file and e.file_sha256
                and _sha256((Path(folder) / e.file).read_bytes()) != e.file_sha256]


def compile_speedups(speedup: float | None, baseline: Baseline | None) -> dict[str, float]:
    """A candidate's speedup over each torch.compile mode of the baseline: its speedup over
    eager divided by the mode's. Modes that failed or were not timed are left out."""
    if not speedup or baseline is None:
        return {}
    return {m.mode: speedup / m.speedup_vs_eager for m in baseline.modes
            if m.mode != "eager" and m.speedup_vs_eager and not m.error}


def claimed_geomean(entries: list[SetEntry]) -> float:
    """CLAIMED_METHOD over a set's entries."""
    return geomean([e.speedup_vs_eager if e.status == "ok" and e.speedup_vs_eager else 1.0
                    for e in entries])


# -- writing --------------------------------------------------------------------------------


def new_manifest(entries: list[SetEntry], source_run: str) -> SolutionSet:
    """The manifest over `entries`, made now, in the oldest format version that holds them:
    an older pike reads a set it can, and says "upgrade pike" of one it cannot instead of
    failing on an unknown status."""
    return SolutionSet(
        version=2 if any(e.status == "slower" for e in entries) else 1,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        source_run=source_run, claimed_geomean=claimed_geomean(entries), tasks=entries)


def write_set(store: RunStore, out_dir: Path) -> Path:
    """Write the run's best correct candidate of each task and manifest.json into out_dir
    (made if missing; refused if it already holds a set or .py files). Returns out_dir."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir}: is a file; give a folder for the solution set")
    if out_dir.is_dir() and (any(out_dir.glob("*.py")) or (out_dir / MANIFEST).exists()):
        raise ConfigError(f"{out_dir}: already holds a solution set or .py files; "
                          "write the set into a new folder")
    return update_set(store, out_dir)


def update_set(store: RunStore, folder: Path, tasks: list[str] | None = None) -> Path:
    """Put the run's entries for `tasks` (all its tasks by default) into the set in
    `folder`, made if missing: each replaces its task's entry and file, every other task's
    stays. A benchmark that runs each task in a run of its own keeps one set this way,
    task by task. Files are written before the manifest that names them, each whole (a
    temp file renamed), so a crash leaves the last consistent set. Returns folder."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder}: is a file; give a folder for the solution set")
    before = read_set(folder) if (folder / MANIFEST).exists() else None
    entries = {e.task: e for e in (before.tasks if before else [])}
    chosen = [t for t in store.tasks() if tasks is None or t["name"] in tasks]
    names = _file_names([t["name"] for t in chosen])
    run = str(store.path.parent.resolve())
    dropped: list[str] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for task in chosen:
            old = entries.get(task["name"])
            file_name = old.file if old is not None and old.file else _free_name(
                names[task["name"]], {e.file for t, e in entries.items()
                                      if t != task["name"] and e.file})
            entry, source = _entry(store, task, file_name)
            entry.source_run = run
            if source is not None:
                _write_whole(folder / file_name, source)
            elif old is not None and old.file:
                dropped.append(old.file)
            entries[task["name"]] = entry
        runs = {e.source_run for e in entries.values()}
        manifest = new_manifest(list(entries.values()), runs.pop() if len(runs) == 1 else "")
        _write_whole(folder / MANIFEST, manifest.model_dump_json(indent=2) + "\n")
        for name in dropped:  # no longer named by the manifest
            (folder / name).unlink(missing_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot write the solution set to {folder}: {err.strerror}") from None
    return folder


def _free_name(name: str, taken: set[str]) -> str:
    """`name`, or `name` with a number before .py where another task's file has it (two
    runs' task names can make the same safe file name)."""
    stem, k = name.removesuffix(".py"), 2
    while name in taken:
        name, k = f"{stem}_{k}.py", k + 1
    return name


def _write_whole(path: Path, text: str) -> None:
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)


def _entry(store: RunStore, task: dict, file_name: str) -> tuple[SetEntry, str | None]:
    name = task["name"]
    base = {"task": name, "task_sha256": task["sha256"]}
    best = store.best(name)
    if best is not None and best.verdict is not None and slower_than_eager(best.verdict.speedup):
        # A user keeps the reference rather than a file that runs slower: on the H100's
        # level1 bench a CUDA graph around a 4 GiB output (its copy) ran at 0.59x.
        v = best.verdict
        return SetEntry(**base, status="slower", candidate_id=best.id, detail=(
            f"the fastest correct candidate ({best.id}, {best.idea or best.role}) ran at "
            f"{v.speedup:.3g}x of eager{' (confirmed)' if v.confirmed else ''}; the "
            "reference is kept, counted 1.0x"), device=v.device, device_name=v.device_name,
            torch_version=v.torch_version, date=best.created_at), None
    if best is not None and best.verdict is not None:
        v = best.verdict
        entry = SetEntry(
            **base, file=file_name, file_sha256=_sha256(best.source.encode()), status="ok",
            speedup_vs_eager=v.speedup,
            compile_speedups=compile_speedups(v.speedup, stored_baseline(store, name)),
            trials_passed=v.trials_passed, trials=v.trials, device=v.device,
            device_name=v.device_name, torch_version=v.torch_version, date=best.created_at,
            candidate_id=best.id)
        return entry, best.source
    error = store.get_state(name, ERROR_STATE)
    if error is not None:
        return SetEntry(**base, status="error", detail=str(error)), None
    if store.get_state(name, MISSING_STATE):
        return SetEntry(**base, status="missing", detail="no solution file"), None
    judged = [c for c in store.candidates(name) if c.role != "reference" and c.verdict]
    if not judged:
        return SetEntry(**base, status="no_candidates", detail="no candidate judged"), None
    return SetEntry(**base, status="failed", detail=_status_counts(judged)), None


def _status_counts(candidates: list[CandidateRow]) -> str:
    counts = Counter(c.verdict.status for c in candidates if c.verdict)
    untimed = sum(1 for c in candidates if c.verdict and c.verdict.ok and not c.verdict.runtime)
    parts = [f"{n} {status}" for status, n in counts.most_common()]
    note = f" ({untimed} correct but not timed)" if untimed else ""
    return f"no correct, timed candidate among {len(candidates)}: {', '.join(parts)}{note}"


def _file_names(tasks: list[str]) -> dict[str, str]:
    return {task: stem + ".py" for task, stem in safe_file_stems(tasks).items()}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- reading --------------------------------------------------------------------------------


def read_set(folder: Path) -> SolutionSet:
    """Read and validate a set's manifest: known format and version, unique task names,
    every listed file a plain .py name present in the folder, files exactly where status
    is ok. Raises ConfigError naming the problem."""
    path = Path(folder) / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{folder}: no {MANIFEST}; not a pike solution set") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(raw, dict) or raw.get("format") != SET_FORMAT:
        raise ConfigError(f"{path}: not a pike solution set (format is not {SET_FORMAT!r})")
    if isinstance(raw.get("version"), int) and raw["version"] > SET_VERSION:
        raise ConfigError(f"{path}: set format version {raw['version']} is newer than this "
                          f"pike reads ({SET_VERSION}); upgrade pike")
    try:
        manifest = SolutionSet.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None
    _check_entries(manifest, Path(folder), path)
    return manifest


def _check_entries(manifest: SolutionSet, folder: Path, path: Path) -> None:
    seen: set[str] = set()
    for e in manifest.tasks:
        if e.task in seen:
            raise ConfigError(f"{path}: task {e.task} is listed twice")
        seen.add(e.task)
        if (e.status == "ok") != (e.file is not None):
            raise ConfigError(f"{path}: task {e.task}: status {e.status} "
                              + ("without a file" if e.file is None else f"with a file ({e.file})"))
        if e.file is None:
            continue
        if Path(e.file).name != e.file or not e.file.endswith(".py") or e.file.startswith("."):
            raise ConfigError(f"{path}: task {e.task}: file {e.file!r} is not a .py file name "
                              "inside the set")
        if not (folder / e.file).is_file():
            raise ConfigError(f"{path}: task {e.task}: file {e.file} is not in {folder}")
