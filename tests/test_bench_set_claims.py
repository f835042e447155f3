"""bench/set_claims.py: a run's solution set as its search measured it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pike.config import RunConfig
from pike.solution_set import write_set
from pike.store import RunStore
from pike.task import load_tasks
from tests.conftest import bench_script
from tests.test_audit import TASKS, fake_baseline, fake_ok
from tests.test_solution_set import GOOD, judged


def test_each_task_over_eager_and_its_fastest_mode_with_the_reference_kept_at_1x(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    with RunStore.create(run, RunConfig().model_dump(mode="json"), "pike bench") as store:
        tasks = {t.name: t for t in load_tasks(TASKS, [1, 2, 3])}
        for t in tasks.values():
            store.add_task(t.name, str(t.path), t.sha256, t.source)
        judged(store, "1_Scale", GOOD, fake_ok(4.0))  # its mode 2x: 2x over it
        judged(store, "2_Softplus", GOOD, fake_ok(0.5))  # slower: the reference, 1.0x
        for name, mode in (("1_Scale", 2.0), ("2_Softplus", 0.8), ("3_RowSum", None)):
            store.set_state(name, "baseline",
                            fake_baseline(tasks[name], mode).model_dump(mode="json"))
        write_set(store, run / "solutions")
    monkeypatch.setattr(sys, "argv", ["set_claims.py", str(run), "--tag", "t",
                                      "--out", str(tmp_path)])
    assert bench_script("set_claims").main() == 0
    data = json.loads((tmp_path / "set-claims-t.json").read_text())
    rows = {r["task"]: r for r in data["rows"]}
    assert rows["1_Scale"]["over_eager"] == 4.0
    assert rows["1_Scale"]["over_fastest_mode"] == pytest.approx(2.0)
    assert rows["2_Softplus"]["status"] == "slower" and rows["2_Softplus"]["over_eager"] == 1.0
    assert rows["2_Softplus"]["over_fastest_mode"] == pytest.approx(1.25)  # 1.0 / 0.8
    assert rows["3_RowSum"]["over_fastest_mode"] is None  # its mode failed: none to take
    assert data["geomean_over_eager"] == pytest.approx(4.0 ** (1 / 3))
    assert data["geomean_over_fastest_mode"] == pytest.approx((2.0 * 1.25) ** 0.5)
    assert data["tasks_with_a_mode"] == 2 and data["below_fastest_mode"] == []
    page = (tmp_path / "set-claims-t.md").read_text()
    assert "(not an audit)" in page and "| 2_Softplus | slower:" in page
