"""The candidates' shared build cache as a whole (eval.limits.build_cache_gib): past its
bound the entries written longest ago go, never one written in the last hour, and an
evaluation leaves the cache within it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pike.config import EvalConfig, LimitsConfig
from pike.evaluate import build_cache_bound
from pike.evaluate.build_cache_bound import YOUNGEST_S, entries, trim, trim_when_due

MIB = 2**20
NOW = 1_800_000_000.0


def _entry(path: Path, mib: int, age_s: float) -> Path:
    """A build folder (or a Triton entry) of `mib` MiB of real blocks, last written
    `age_s` ago."""
    path.mkdir(parents=True)
    with open(path / "module.so", "wb") as f:
        f.write(os.urandom(mib * MIB))
    for node in (path / "module.so", path):
        os.utime(node, (NOW - age_s, NOW - age_s))
    return path


def test_each_build_folder_and_each_triton_or_inductor_entry_counts_apart(
        tmp_path: Path) -> None:
    _entry(tmp_path / "abcd-1234", 1, 10)
    _entry(tmp_path / "triton" / "K1", 2, 20)
    _entry(tmp_path / "inductor" / "fx", 1, 30)
    found = {e.path.relative_to(tmp_path).as_posix(): e for e in entries(tmp_path)}
    assert set(found) == {"abcd-1234", "triton/K1", "inductor/fx"}
    assert found["triton/K1"].bytes >= 2 * MIB
    assert found["abcd-1234"].written == NOW - 10


def test_under_its_bound_nothing_goes(tmp_path: Path) -> None:
    for i in range(3):
        _entry(tmp_path / f"b{i}", 1, YOUNGEST_S * 2)
    assert trim(tmp_path, 8 * MIB, now=NOW) == []
    assert len(entries(tmp_path)) == 3


def test_past_its_bound_the_oldest_go_down_to_three_quarters(tmp_path: Path) -> None:
    ages = {"b0": 5, "b1": 4, "triton/t2": 3, "b3": 2.5}  # in hours
    for name, hours in ages.items():
        _entry(tmp_path / name, 2, hours * 3600)
    # 8 MiB held against a bound of 7: down to 5.25, so the two oldest go
    removed = trim(tmp_path, 7 * MIB, now=NOW)
    assert [e.path.relative_to(tmp_path).as_posix() for e in removed] == ["b0", "b1"]
    assert sorted(e.path.relative_to(tmp_path).as_posix() for e in entries(tmp_path)) == [
        "b3", "triton/t2"]


def test_what_was_written_in_the_last_hour_stays_over_the_bound(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _entry(tmp_path / "old", 2, YOUNGEST_S + 60)
    _entry(tmp_path / "young", 4, YOUNGEST_S - 60)  # a running candidate's, maybe
    removed = trim(tmp_path, 3 * MIB, now=NOW)
    assert [e.path.name for e in removed] == ["old"]
    assert (tmp_path / "young" / "module.so").exists()
    assert "over its bound" in caplog.text


def test_a_file_inside_an_old_folder_written_lately_keeps_the_folder(tmp_path: Path) -> None:
    old = _entry(tmp_path / "old", 2, 5 * 3600)
    os.utime(old / "module.so", (NOW - 60, NOW - 60))
    assert trim(tmp_path, 1 * MIB, now=NOW) == []


def test_checks_come_at_most_once_a_minute_and_none_without_a_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(build_cache_bound, "trim", lambda root, b: calls.append(root) or [])
    monkeypatch.setattr(build_cache_bound, "_last_check", {})
    trim_when_due(tmp_path, None)
    assert calls == []
    trim_when_due(tmp_path, 1.0)
    trim_when_due(tmp_path, 1.0)
    assert calls == [tmp_path]


def test_an_evaluation_trims_the_shared_cache(
        mlp_task, fast_config: EvalConfig, tmp_path: Path,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.evaluate import evaluate
    from pike.evaluate.child_launch import build_cache_root
    from tests.conftest import CANDIDATES

    cfg = fast_config.model_copy(update={
        "build_cache": tmp_path / "cache",
        "limits": fast_config.limits.model_copy(update={"build_cache_gib": 1 / 1024})})
    root = build_cache_root(cfg)
    stale = _entry(root / "triton" / "stale", 2, 0)
    old = time.time() - 2 * YOUNGEST_S
    for node in (stale / "module.so", stale):
        os.utime(node, (old, old))
    monkeypatch.setattr(build_cache_bound, "_last_check", {})
    verdict = evaluate(mlp_task, (CANDIDATES / "fused.py").read_text(), cfg)
    assert verdict.ok, verdict.message
    assert not stale.exists()


def test_the_bound_is_a_setting() -> None:
    assert LimitsConfig().build_cache_gib == 32
    assert LimitsConfig(build_cache_gib=None).build_cache_gib is None
    with pytest.raises(ValueError):
        LimitsConfig(build_cache_gib=0)
