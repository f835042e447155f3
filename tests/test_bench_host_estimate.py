"""bench/host_estimate.py: the gate's guess for each task from the others, against its peak."""

from __future__ import annotations

from pathlib import Path

from pike.evaluate import task_size
from pike.store import FOOTPRINT_STATE, RunStore
from pike.task import Task
from tests.conftest import EXAMPLES, bench_script

GIB = 2**30


def test_each_task_is_guessed_from_the_others_only(tmp_path: Path) -> None:
    host_estimate = bench_script("host_estimate")
    config = {"eval": {"trials": 5, "timing": {"input_sets": 2}}}
    tasks = [Task.from_file(EXAMPLES / "tasks" / name)
             for name in ("1_GeluMLP.py", "2_ConvBlock.py", "3_CausalAttention.py")]
    took = {tasks[0].name: 9 * GIB, tasks[1].name: 5 * GIB}  # the third: never measured
    with RunStore.create(tmp_path / "run", config, "test") as store:
        for task in tasks:
            # the path the device saw: only its name is looked for in the folder given
            store.add_task(task.name, f"/elsewhere/{task.path.name}", task.sha256, task.source)
            if task.name in took:
                store.set_state(task.name, FOOTPRINT_STATE, {"reference": took[task.name]})
    rows, counts = host_estimate._rows(tmp_path / "run", EXAMPLES / "tasks")
    assert counts == {"trials": 5, "input_sets": 2}
    assert [r["task"] for r in rows] == [tasks[0].name, tasks[1].name]
    mlp, conv = rows
    for row, task in ((mlp, tasks[0]), (conv, tasks[1])):
        assert row["structural"] == task_size.structural_for(
            task_size.on_meta(str(task.path)), 5, 2)
    # each from the other's part beyond its own, never its own
    assert mlp["estimate"] == mlp["structural"] + (conv["measured"] - conv["structural"])
    assert conv["estimate"] == conv["structural"] + (mlp["measured"] - mlp["structural"])
    assert (mlp["largest_other"], conv["largest_other"]) == (5 * GIB, 9 * GIB)
