"""Which solution file belongs to which task, and what the solution set claims.

A SOLUTIONS folder is matched to tasks in the first of these ways that applies:

1. `manifest.json` (a pike solution set, see pike/solution_set.py): the manifest maps
   each task name to its file; a task it lists without a file, or does not list, has none.
2. `mapping.yaml` (or `mapping.yml`): `TASK: FILE` lines, where TASK is a task name
   (`10_ResNet101`) or a numeric id (`10`) and FILE a path relative to the folder. Tasks
   the mapping does not name have no file; there is no guessing besides it.
3. File names: `<task name>.py` (`10_ResNet101.py`), else `task_<id>.py` (`task_10.py`),
   else `<id>_*.py` (`10_anything.py`, KernelBench style). Two files that fit one task
   (and no exact name among them) are an error, not a guess. Names starting with `_`
   are ignored.

The claimed figure comes from the manifest's `claimed_geomean`, else from `claimed.json`
(`{"geomean": 2.3}`, optionally `"source": "paper, table 2"`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pike.errors import ConfigError
from pike.solution_set import MANIFEST, SolutionSet, read_set
from pike.task import Task

MAPPING_FILES = ("mapping.yaml", "mapping.yml")
CLAIMED_FILE = "claimed.json"
_ID_PREFIX = re.compile(r"^(\d+)_")


@dataclass
class Claim:
    """A figure the set's authors give for their own set."""

    geomean: float
    source: str  # where it was read: "manifest.json", "claimed.json (paper, table 2)"


@dataclass
class Matching:
    """The file of each task (None: no file), and what the audit must say about the folder."""

    files: dict[str, Path | None]
    how: str  # "manifest.json", "mapping.yaml", "file names"
    solution_set: SolutionSet | None = None
    claim: Claim | None = None
    notes: list[str] = field(default_factory=list)  # warnings for the audit's result

    def unmatched(self, folder: Path) -> list[str]:
        """.py files in the folder that no task got."""
        used = {p.resolve() for p in self.files.values() if p is not None}
        return sorted(p.name for p in _python_files(folder) if p.resolve() not in used)


def match_solutions(solutions: Path, tasks: list[Task]) -> dict[str, Path | None]:
    """Task name -> its solution file in `solutions` (None where there is none)."""
    return match(solutions, tasks).files


def match(solutions: Path, tasks: list[Task]) -> Matching:
    folder = Path(solutions)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such solutions folder")
    mapping = next((folder / n for n in MAPPING_FILES if (folder / n).is_file()), None)
    if (folder / MANIFEST).is_file():
        found = _by_manifest(folder, tasks)
        if mapping is not None:
            found.notes.append(f"{mapping.name} ignored: {MANIFEST} maps the files")
    elif mapping is not None:
        found = _by_mapping(mapping, tasks)
    else:
        found = Matching({t.name: _by_name(folder, t) for t in tasks}, "file names")
    if found.claim is None:
        found.claim = _claimed_file(folder)
    return found


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_") and p.is_file())


def _by_name(folder: Path, task: Task) -> Path | None:
    exact = folder / f"{task.name}.py"
    if exact.is_file():
        return exact
    if task.id is None:
        return None
    fits = [p for p in _python_files(folder)
            if p.name == f"task_{task.id}.py" or _file_id(p) == task.id]
    if len(fits) > 1:
        raise ConfigError(f"{folder}: {len(fits)} files fit task {task.name} "
                          f"({', '.join(p.name for p in fits)}); keep one or add a mapping.yaml")
    return fits[0] if fits else None


def _file_id(path: Path) -> int | None:
    found = _ID_PREFIX.match(path.name)
    return int(found.group(1)) if found else None


def _by_manifest(folder: Path, tasks: list[Task]) -> Matching:
    manifest = read_set(folder)
    files: dict[str, Path | None] = {}
    for task in tasks:
        entry = manifest.entry(task.name)
        files[task.name] = folder / entry.file if entry and entry.file else None
    claim = Claim(manifest.claimed_geomean, f"{MANIFEST}: {manifest.claimed_geomean_method}")
    return Matching(files, MANIFEST, solution_set=manifest, claim=claim)


def _by_mapping(path: Path, tasks: list[Task]) -> Matching:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: not readable YAML ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must map task names or ids to file names")
    by_name = {t.name: t for t in tasks}
    by_id = {t.id: t for t in tasks if t.id is not None}
    found = Matching({t.name: None for t in tasks}, path.name)
    for key, value in raw.items():
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{path}: {key}: the file must be a file name, not {value!r}")
        task = by_name.get(str(key))
        if task is None and str(key).isdigit():
            task = by_id.get(int(key))
        if task is None:
            found.notes.append(f"{path.name}: {key} names none of the audited tasks")
            continue
        file = path.parent / value
        if not file.is_file():
            found.notes.append(f"{path.name}: {key}: {value} does not exist; counted missing")
            continue
        found.files[task.name] = file
    return found


def _claimed_file(folder: Path) -> Claim | None:
    path = folder / CLAIMED_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        value = float(raw["geomean"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
            ValueError) as err:
        raise ConfigError(f"{path}: must be JSON like {{\"geomean\": 2.3}} ({err})") from None
    if value <= 0:
        raise ConfigError(f"{path}: geomean must be positive, not {value}")
    source = raw.get("source")
    return Claim(value, CLAIMED_FILE + (f" ({source})" if source else ""))
