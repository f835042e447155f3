"""bench/audit_offline.py's broken copy: each break must be caught as what it claims to be.

The seed-dependent break is keyed on the evaluator's own trial inputs; an earlier version
keyed it on the first input value, which on the H100 run happened to be above the median
on every trial, so the file was plainly wrong instead of seed-dependent.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pike.audit import audit
from tests.test_audit import TASKS, audit_config

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench_audit() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the bench scripts import their `common` module
    try:
        spec = importlib.util.spec_from_file_location("bench_audit_offline",
                                                      BENCH / "audit_offline.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_the_broken_copy_fails_each_way_it_claims(bench_audit: ModuleType, tmp_path: Path,
                                                  build_cache: Path) -> None:
    cfg = audit_config(build_cache)
    cfg.eval.seed = bench_audit.KNOWN_SEED  # the break is tuned to it, as the bench runs
    # an offline benchmark's rows, as bench/offline.py writes them
    results = {"rows": [{"task": name, "offline_idea": "inference_mode"}
                        for name in ("1_Scale", "2_Softplus", "3_RowSum")]}
    good, broken, breaks = bench_audit.build_sets(results, TASKS, tmp_path / "sets", cfg.eval)
    assert breaks == {"1_Scale": "wrong", "2_Softplus": "crash", "3_RowSum": "seed-dependent"}
    assert sorted(p.name for p in good.iterdir()) == sorted(p.name for p in broken.iterdir())
    result = audit(broken, TASKS, cfg, out=tmp_path / "run")
    verdicts = {t.task: t for t in result.tasks}
    assert verdicts["1_Scale"].status == "incorrect" and verdicts["1_Scale"].trials_passed == 0
    assert verdicts["2_Softplus"].status == "runtime_error"
    seed = verdicts["3_RowSum"]
    assert seed.seed_dependent and seed.status == "incorrect"
    assert 0 < seed.trials_passed < seed.trials
    assert verdicts["4_Negate"].status == "missing"


def test_no_seed_dependent_break_without_a_float_input(bench_audit: ModuleType,
                                                       tmp_path: Path) -> None:
    task_file = tmp_path / "7_Index.py"
    task_file.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, i):\n        return i * 2\n\n\n"
        "def get_inputs():\n    return [torch.randint(0, 9, (4,))]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    from pike.task import Task
    assert bench_audit.seed_dependent_index(Task.from_file(task_file), bench_audit.KNOWN_SEED,
                                            5) is None
