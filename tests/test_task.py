"""Loading tasks: one file, a folder, FOLDER/ID; a malformed task is a one-line TaskError."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from pike.config import EvalConfig
from pike.errors import TaskError
from pike.evaluate import evaluate
from pike.task import Task, load_task, load_tasks
from tests.conftest import EXAMPLES, candidate

GOOD = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
'''
FORWARD_LINE = GOOD.splitlines().index("    def forward(self, x):") + 1


def write(folder: Path, name: str, source: str = GOOD) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(source)
    return path


def edit(old: str, new: str) -> Callable[[str], str]:
    def apply(source: str) -> str:
        assert old in source
        return source.replace(old, new)
    return apply


def assert_task_error(err: pytest.ExceptionInfo[TaskError], names: Path | str,
                      *words: str) -> None:
    message = str(err.value)
    assert "\n" not in message, message
    assert str(names) in message, message
    for word in words:
        assert word in message, message


# ---- one file ---------------------------------------------------------------------------


def test_load_one_file(tmp_path: Path) -> None:
    path = write(tmp_path, "7_Double.py")
    task = Task.from_file(path)
    assert task.name == "7_Double"
    assert task.id == 7
    assert task.path == path.resolve() and task.path.is_absolute()
    assert task.source == GOOD
    assert task.sha256 == hashlib.sha256(GOOD.encode()).hexdigest()
    assert load_task(path) == task
    assert load_task(str(path)) == task


def test_file_without_numeric_prefix_has_no_id(tmp_path: Path) -> None:
    assert Task.from_file(write(tmp_path, "double.py")).id is None


def test_loading_does_not_run_the_task(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write(tmp_path, "1_Side.py", GOOD + f"\nopen({str(marker)!r}, 'w').close()\n")
    Task.from_file(path)
    load_tasks(tmp_path)
    assert not marker.exists()


def test_example_task(mlp_task: Task) -> None:
    assert (mlp_task.name, mlp_task.id) == ("1_GeluMLP", 1)
    assert "class Model" in mlp_task.source


# ---- malformed tasks --------------------------------------------------------------------

MALFORMED = [
    # id, how GOOD is broken, words the message must contain
    ("syntax_error", edit("def forward(self, x):", "def forward(self, x)"),
     f":{FORWARD_LINE}: syntax error"),
    ("indentation_error", edit("        return x * 2", "return x * 2"), "syntax error"),
    ("null_byte", edit("return x * 2", "return x * 2\x00"), "syntax error: source code"),
    ("no_model", edit("class Model(", "class Net("), "defines no `Model` class"),
    ("model_is_function",
     edit("class Model(nn.Module):", "def Model():\n    pass\n\n\nclass Net(nn.Module):"),
     "`Model` is not a class"),
    ("model_is_constant", edit("class Model(", "Model = None\n\n\nclass Net("),
     "`Model` is not a class"),
    ("no_get_inputs", edit("def get_inputs(", "def make_inputs("),
     "defines no `get_inputs()` function"),
    ("no_get_init_inputs", edit("def get_init_inputs(", "def init_inputs("),
     "defines no `get_init_inputs()` function"),
    ("get_inputs_is_class", edit("def get_inputs():", "class get_inputs:"),
     "`get_inputs` must be a function, not a class"),
    ("get_inputs_is_list", edit("def get_inputs():\n    return [torch.randn(4, 4)]",
                                "get_inputs = [torch.randn(4, 4)]"),
     "`get_inputs` must be a function, not a constant"),
    ("get_init_inputs_is_list", edit("def get_init_inputs():\n    return []",
                                     "get_init_inputs = []"),
     "`get_init_inputs` must be a function, not a constant"),
]


@pytest.mark.parametrize(("name", "breaker", "words"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_task_is_a_one_line_error(tmp_path: Path, name: str,
                                            breaker: Callable[[str], str], words: str) -> None:
    path = write(tmp_path, f"3_{name}.py", breaker(GOOD))
    with pytest.raises(TaskError) as err:
        Task.from_file(path)
    assert_task_error(err, path, words)
    with pytest.raises(TaskError) as err:
        load_task(tmp_path / "3")
    assert_task_error(err, "3_" + name, words)


def test_valid_variants_are_accepted(tmp_path: Path) -> None:
    """Assignments and lambdas are callables too: only literals are rejected."""
    source = GOOD.replace("def get_init_inputs():\n    return []",
                          "get_init_inputs = lambda: []  # noqa: E731")
    source = source.replace("class Model(", "class _Model(") + "\n\nModel = _Model\n"
    assert Task.from_file(write(tmp_path, "1_Aliased.py", source)).name == "1_Aliased"


def test_unreadable_task_file(tmp_path: Path) -> None:
    path = tmp_path / "1_Latin1.py"
    path.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    with pytest.raises(TaskError) as err:
        Task.from_file(path)
    assert_task_error(err, path, "cannot read")


def test_missing_task_file(tmp_path: Path) -> None:
    path = tmp_path / "9_Missing.py"
    for load in (Task.from_file, load_task):
        with pytest.raises(TaskError) as err:
            load(path)
        assert_task_error(err, path, "no such task file")


def test_a_malformed_file_in_a_folder_is_named(tmp_path: Path) -> None:
    write(tmp_path, "1_Good.py")
    bad = write(tmp_path, "2_Bad.py", GOOD.replace("def get_inputs(", "def inputs("))
    with pytest.raises(TaskError) as err:
        load_tasks(tmp_path)
    assert_task_error(err, bad, "defines no `get_inputs()` function")
    assert [t.name for t in load_tasks(tmp_path, [1])] == ["1_Good"]  # only what is asked


# ---- folders and FOLDER/ID --------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = tmp_path / "level"
    for name in ("10_Ten.py", "2_Two.py", "1_One.py", "extra.py"):
        write(folder, name)
    write(folder, "_helpers.py", "this is not python")  # private: never loaded
    write(folder, "notes.txt", "not a task")
    return folder


def test_load_folder_sorted_by_numeric_id(folder: Path) -> None:
    tasks = load_tasks(folder)
    assert [t.name for t in tasks] == ["1_One", "2_Two", "10_Ten", "extra"]
    assert [t.id for t in tasks] == [1, 2, 10, None]
    assert all(t.path.parent == folder.resolve() for t in tasks)


def test_load_some_ids_of_a_folder_in_the_order_asked(folder: Path) -> None:
    assert [t.name for t in load_tasks(folder, [10, 1])] == ["10_Ten", "1_One"]
    assert [t.name for t in load_tasks(str(folder), [2])] == ["2_Two"]


@pytest.mark.parametrize(("spec", "name"), [("2", "2_Two"), ("10", "10_Ten"), ("1", "1_One"),
                                            ("02", "2_Two")])
def test_load_task_by_folder_and_id(folder: Path, spec: str, name: str) -> None:
    assert load_task(folder / spec).name == name
    assert load_task(f"{folder}/{spec}").name == name


def test_example_tasks_folder() -> None:
    tasks = load_tasks(EXAMPLES / "tasks")
    assert [t.id for t in tasks] == [1, 2, 3]
    assert load_task(EXAMPLES / "tasks" / "3") == tasks[2]


def test_unknown_id(folder: Path) -> None:
    with pytest.raises(TaskError) as err:
        load_task(folder / "7")
    assert_task_error(err, folder, "no task file with id 7")
    with pytest.raises(TaskError) as err:
        load_tasks(folder, [1, 7, 8])
    assert_task_error(err, folder, "no task file with id 7, 8")


def test_ambiguous_id(folder: Path) -> None:
    write(folder, "2_Other.py")
    with pytest.raises(TaskError) as err:
        load_task(folder / "2")
    assert_task_error(err, folder, "id 2 is ambiguous", "2_Other.py", "2_Two.py")
    with pytest.raises(TaskError):
        load_tasks(folder, [2])
    assert len(load_tasks(folder)) == 5  # loading the whole folder is not ambiguous


def test_folder_is_not_a_task(folder: Path) -> None:
    with pytest.raises(TaskError) as err:
        load_task(folder)
    assert_task_error(err, folder, "is a folder")


def test_missing_and_empty_folders(tmp_path: Path) -> None:
    with pytest.raises(TaskError) as err:
        load_tasks(tmp_path / "nowhere")
    assert_task_error(err, tmp_path / "nowhere", "no such task folder")
    with pytest.raises(TaskError) as err:
        load_task(tmp_path / "nowhere" / "3")
    assert_task_error(err, tmp_path / "nowhere" / "3", "no such task file")
    with pytest.raises(TaskError) as err:
        load_tasks(tmp_path)
    assert_task_error(err, tmp_path, "contains no task files")


# ---- what only running the task can show --------------------------------------------------

RUNTIME_MALFORMED = [
    ("get_inputs_returns_tensor", edit("return [torch.randn(4, 4)]", "return torch.randn(4, 4)"),
     "get_inputs() must return a list or tuple"),
    ("get_init_inputs_returns_int", edit("def get_init_inputs():\n    return []",
                                         "def get_init_inputs():\n    return 3"),
     "get_init_inputs() must return a list or tuple"),
]


@pytest.mark.parametrize(("name", "breaker", "words"), RUNTIME_MALFORMED,
                         ids=[c[0] for c in RUNTIME_MALFORMED])
def test_wrong_return_types_are_a_task_error_when_evaluated(
        tmp_path: Path, fast_config: EvalConfig, name: str, breaker: Callable[[str], str],
        words: str) -> None:
    path = write(tmp_path, f"1_{name}.py", breaker(GOOD))
    task = Task.from_file(path)  # the loader only parses: return types show when run
    fast_config.time_candidate = False
    with pytest.raises(TaskError) as err:
        evaluate(task, candidate("fused"), fast_config)
    assert_task_error(err, path, words)
