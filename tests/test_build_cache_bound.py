"""The candidates' shared build cache as a whole (eval.limits.build_cache_gib): past its
bound the entries changed longest ago go, never one changed in the last hour, never
through a link, and an evaluation leaves the cache within it without failing for it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pike.config import EvalConfig, LimitsConfig
from pike.evaluate import build_cache_bound
from pike.evaluate.build_cache_bound import EVERY_S, YOUNGEST_S, entries, trim, trim_when_due

MIB = 2**20


def _entry(path: Path, mib: int) -> float:
    """A build folder (or a Triton entry) of `mib` MiB of real blocks; its change time.
    Entries made one after another change in that order (a short sleep apart)."""
    time.sleep(0.05)
    path.mkdir(parents=True)
    with open(path / "module.so", "wb") as f:
        f.write(os.urandom(mib * MIB))
    return max(os.lstat(path).st_ctime, os.lstat(path / "module.so").st_ctime)


def _labels(found: list[build_cache_bound.Entry]) -> list[str]:
    return [e.label for e in found]


def _trim(root: Path, bound: int, now: float) -> list[str]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _labels(trim(fd, bound, now=now))
    finally:
        os.close(fd)


def _entries(root: Path) -> dict[str, build_cache_bound.Entry]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return {e.label: e for e in entries(fd)}
    finally:
        os.close(fd)


def test_each_build_folder_and_each_triton_or_inductor_entry_counts_apart(
        tmp_path: Path) -> None:
    changed = _entry(tmp_path / "abcd-1234", 1)
    _entry(tmp_path / "triton" / "K1", 2)
    _entry(tmp_path / "inductor" / "fx", 1)
    _entry(tmp_path / "inductor" / "precompiled_headers", 1)  # every child's: kept
    found = _entries(tmp_path)
    assert set(found) == {"abcd-1234", "triton/K1", "inductor/fx"}
    assert found["triton/K1"].bytes >= 2 * MIB
    assert found["abcd-1234"].changed == changed


def test_a_file_of_many_names_counts_once_and_a_future_time_does_not_keep_it(
        tmp_path: Path) -> None:
    """Both were ways to game the bound: names of one file pushing others out, a
    modification time set to the future keeping an entry forever."""
    _entry(tmp_path / "a", 2)
    for i in range(20):
        os.link(tmp_path / "a" / "module.so", tmp_path / "a" / f"again-{i}")
    future = time.time() + 10 * YOUNGEST_S
    os.utime(tmp_path / "a" / "module.so", (future, future))
    found = _entries(tmp_path)["a"]
    assert 2 * MIB <= found.bytes < 3 * MIB
    assert found.changed < time.time() + 1
    assert _trim(tmp_path, MIB, now=time.time() + 2 * YOUNGEST_S) == ["a"]


def test_under_its_bound_nothing_goes(tmp_path: Path) -> None:
    for i in range(3):
        _entry(tmp_path / f"b{i}", 1)
    assert _trim(tmp_path, 8 * MIB, now=time.time() + 2 * YOUNGEST_S) == []
    assert len(_entries(tmp_path)) == 3


def test_past_its_bound_the_least_recently_changed_go_down_to_three_quarters(
        tmp_path: Path) -> None:
    for name in ("b0", "b1", "triton/t2", "b3"):
        last = _entry(tmp_path / name, 2)
    # 8 MiB held against a bound of 7: down to 5.25, so the two oldest go
    assert _trim(tmp_path, 7 * MIB, now=last + 2 * YOUNGEST_S) == ["b0", "b1"]
    assert sorted(_entries(tmp_path)) == ["b3", "triton/t2"]


def test_what_changed_in_the_last_hour_stays_over_the_bound(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _entry(tmp_path / "old", 2)
    time.sleep(0.3)
    young = _entry(tmp_path / "young", 4)  # a running candidate's, maybe
    assert _trim(tmp_path, 3 * MIB, now=young + YOUNGEST_S - 0.1) == ["old"]
    assert (tmp_path / "young" / "module.so").exists()
    assert "over its bound" in caplog.text


def test_a_file_changed_lately_inside_an_old_folder_keeps_the_folder(tmp_path: Path) -> None:
    _entry(tmp_path / "old", 2)
    time.sleep(0.3)
    (tmp_path / "old" / "module.so").write_bytes(b"rebuilt")
    now = os.lstat(tmp_path / "old" / "module.so").st_ctime + YOUNGEST_S - 0.1
    assert _trim(tmp_path, 1, now=now) == []


def test_a_link_in_the_cache_is_removed_and_never_followed(tmp_path: Path) -> None:
    """A candidate may plant links in the shared cache, or put one in place of `triton`:
    the trim removes the link, not what it names."""
    outside = tmp_path / "outside"
    _entry(outside / "keep", 1)
    root = tmp_path / "cache"
    _entry(root / "b0", 2)
    root.joinpath("link").symlink_to(outside)
    root.joinpath("triton").symlink_to(outside)
    (root / "b0" / "into").symlink_to(outside / "keep")
    assert sorted(_trim(root, MIB, now=time.time() + 2 * YOUNGEST_S)) == ["b0", "link", "triton"]
    assert (outside / "keep" / "module.so").exists()


def test_checks_come_at_most_once_a_minute_and_none_without_a_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    clock = [1000.0]
    monkeypatch.setattr(build_cache_bound, "trim", lambda fd, b: calls.append(b) or [])
    monkeypatch.setattr(build_cache_bound, "_last_check", {})
    monkeypatch.setattr(build_cache_bound, "_monotonic", lambda: clock[0])
    cfg = EvalConfig(build_cache=tmp_path)
    trim_when_due(cfg.model_copy(update={"limits": LimitsConfig(build_cache_gib=None)}))
    assert calls == []
    trim_when_due(cfg)
    clock[0] += EVERY_S - 1
    trim_when_due(cfg)
    assert calls == [32 * 2**30]
    clock[0] += 1
    trim_when_due(cfg)
    assert len(calls) == 2


def test_nothing_in_the_trim_reaches_the_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(fd: int, bound: int) -> list[build_cache_bound.Entry]:
        raise RecursionError("a tree too deep")

    monkeypatch.setattr(build_cache_bound, "trim", broken)
    monkeypatch.setattr(build_cache_bound, "_last_check", {})
    trim_when_due(EvalConfig(build_cache=tmp_path))
    assert "could not be trimmed: a tree too deep" in caplog.text


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
    stale = root / "triton" / "stale"
    _entry(stale, 2)
    monkeypatch.setattr(build_cache_bound, "YOUNGEST_S", 0.0)  # as if made long ago
    monkeypatch.setattr(build_cache_bound, "_last_check", {})
    verdict = evaluate(mlp_task, (CANDIDATES / "fused.py").read_text(), cfg)
    assert verdict.ok, verdict.message
    assert not stale.exists()


def test_the_bound_is_a_setting() -> None:
    assert LimitsConfig().build_cache_gib == 32
    assert LimitsConfig(build_cache_gib=None).build_cache_gib is None
    with pytest.raises(ValueError):
        LimitsConfig(build_cache_gib=0)


def test_an_entry_nested_past_what_is_read_goes_once_old(tmp_path: Path) -> None:
    """Data below MAX_DEPTH folders is not measured, so such an entry would stay under
    any bound: no tool makes one, and it goes once an hour old, whatever the total."""
    from pike.evaluate.tree_removal import MAX_DEPTH

    deep = tmp_path / "hidden" / Path(*["d"] * (MAX_DEPTH + 5))
    deep.mkdir(parents=True)
    (deep / "data").write_bytes(os.urandom(MIB))
    last = _entry(tmp_path / "b0", 1)
    found = _entries(tmp_path)
    assert found["hidden"].deep and not found["b0"].deep
    assert found["hidden"].bytes < MIB
    assert _trim(tmp_path, 100 * MIB, now=last + YOUNGEST_S - 1) == []  # too young
    assert _trim(tmp_path, 100 * MIB, now=last + 2 * YOUNGEST_S) == ["hidden"]
    assert sorted(_entries(tmp_path)) == ["b0"]


def test_a_trim_reads_a_bounded_number_of_files_and_spares_what_it_did_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(build_cache_bound, "MAX_WALKED", 5)
    for i in range(4):
        last = _entry(tmp_path / f"b{i}", 1)
    removed = _trim(tmp_path, MIB, now=last + 2 * YOUNGEST_S)
    assert len(removed) < 4  # the ones not read stay
    assert "were not measured" in caplog.text
