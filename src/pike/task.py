"""Tasks in KernelBench format: a `Model` class, `get_inputs()` and `get_init_inputs()`.

Loading a task only reads and parses its file: the task's code runs in the evaluator's
reference child process, never in the caller's process.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from pike.errors import ConfigError, TaskError

REQUIRED_FUNCTIONS = ("get_inputs", "get_init_inputs")
_ID_PREFIX = re.compile(r"^(\d+)_")


def source_sha256(source: str) -> str:
    """A task's key: the SHA-256 of its source (Task.sha256)."""
    return hashlib.sha256(source.encode()).hexdigest()


@dataclass(frozen=True)
class Task:
    """A reference PyTorch module to make faster."""

    name: str
    path: Path
    source: str

    @property
    def id(self) -> int | None:
        """The numeric prefix of the file name (`10_ResNet101.py` -> 10), if any."""
        match = _ID_PREFIX.match(self.path.name)
        return int(match.group(1)) if match else None

    @property
    def sha256(self) -> str:
        return source_sha256(self.source)

    @classmethod
    def from_file(cls, path: str | Path) -> Task:
        path = Path(path)
        if not path.is_file():
            raise TaskError(f"{path}: no such task file")
        try:
            source = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise TaskError(f"{path}: cannot read ({err})") from None
        check_task_source(source, path)
        return cls(name=path.stem, path=path.resolve(), source=source)


def check_task_source(source: str, path: Path) -> None:
    """Raise TaskError naming the file and the problem if the source is not a task."""
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as err:
        where = f"{path}:{err.lineno}" if err.lineno else str(path)
        raise TaskError(f"{where}: syntax error: {err.msg}") from None
    except ValueError as err:  # Python 3.10 reports null bytes this way
        raise TaskError(f"{path}: syntax error: {err}") from None
    top = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    top[target.id] = node
    if "Model" not in top:
        raise TaskError(f"{path}: defines no `Model` class")
    if not isinstance(top["Model"], (ast.ClassDef, ast.Assign)) or _literal(top["Model"]):
        raise TaskError(f"{path}: `Model` is not a class")
    for name in REQUIRED_FUNCTIONS:
        if name not in top:
            raise TaskError(f"{path}: defines no `{name}()` function")
        if isinstance(top[name], ast.ClassDef):
            raise TaskError(f"{path}: `{name}` must be a function, not a class")
        if _literal(top[name]):
            raise TaskError(f"{path}: `{name}` must be a function, not a constant")


def _literal(node: ast.AST) -> bool:
    """An assignment of a literal value (`get_inputs = [x]`), which cannot be called."""
    return isinstance(node, ast.Assign) and isinstance(
        node.value, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr))


def tasks_to_redo(tasks: list[Task], ids: list[int], run: str) -> list[Task]:
    """The tasks of `ids` (each once, in the order given) for a run's `--redo`; a
    ConfigError names the ids the run (`run`: "campaign", "audit") does not hold."""
    by_id = {t.id: t for t in tasks if t.id is not None}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise ConfigError(f"--redo {','.join(map(str, unknown))}: no such task in this {run} "
                          f"(its ids: {','.join(map(str, sorted(by_id)))})")
    return [by_id[i] for i in dict.fromkeys(ids)]


def load_tasks(folder: str | Path, ids: list[int] | None = None) -> list[Task]:
    """All task files of a folder, sorted by numeric id then name; optionally only `ids`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskError(f"{folder}: no such task folder")
    files = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    by_id: dict[int, list[Path]] = {}
    for p in files:
        match = _ID_PREFIX.match(p.name)
        if match:
            by_id.setdefault(int(match.group(1)), []).append(p)
    if ids is not None:
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise TaskError(f"{folder}: no task file with id {', '.join(map(str, missing))}")
        for i in ids:
            if len(by_id[i]) > 1:
                names = ", ".join(p.name for p in by_id[i])
                raise TaskError(f"{folder}: id {i} is ambiguous ({names}); name the file")
        return [Task.from_file(by_id[i][0]) for i in ids]
    tasks = [Task.from_file(p) for p in files]
    if not tasks:
        raise TaskError(f"{folder}: contains no task files (*.py)")
    return sorted(tasks, key=lambda t: (t.id is None, t.id or 0, t.name))


def load_task(spec: str | Path) -> Task:
    """A task from a file path, or `FOLDER/ID` (`level3/10` finds `level3/10_ResNet101.py`)."""
    path = Path(spec)
    if path.is_file():
        return Task.from_file(path)
    if path.is_dir():
        raise TaskError(f"{path}: is a folder; name one task as {path}/ID or a file")
    if path.name.isdigit() and path.parent.is_dir():
        return load_tasks(path.parent, [int(path.name)])[0]
    raise TaskError(f"{path}: no such task file")


def safe_file_stems(names: list[str]) -> dict[str, str]:
    """A file-system-safe, unique stem for each task name (names come from users' files);
    unique also on case-insensitive file systems."""
    stems: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:80] or "task"
        unique, n = stem, 2
        while unique.lower() in taken:
            unique, n = f"{stem}-{n}", n + 1
        taken.add(unique.lower())
        stems[name] = unique
    return stems
