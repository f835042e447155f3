"""Solution sets: write_set() from a run store, read_set() back, and an audit of the
written set that uses its manifest (files, claimed figures, task sha256)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pike.audit import audit
from pike.config import RunConfig
from pike.errors import ConfigError, TaskError
from pike.evaluate import Verdict
from pike.solution_set import (
    CLAIMED_METHOD,
    MANIFEST,
    SolutionSet,
    read_set,
    update_set,
    write_set,
)
from pike.store import RunStore
from pike.task import Task, load_tasks
from tests.test_audit import MIXED, TASKS, FakeJudge, audit_config, by_task, fake_baseline, fake_ok

GOOD = (MIXED / "task_1.py").read_text()


def judged(store: RunStore, task: str, source: str, verdict: Verdict) -> int:
    cid = store.add_candidate(task, source, parent_id=None, role="optimize", round=0, branch=0)
    store.set_verdict(cid, verdict)
    return cid


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run over four tasks: 1_Scale solved twice (5x and 2x), 2_Softplus only failed,
    3_RowSum's reference failed, 4_Negate has no judged candidate."""
    run_dir = tmp_path / "run"
    with RunStore.create(run_dir, RunConfig().model_dump(mode="json"), "pike bench") as store:
        tasks = {t.name: t for t in load_tasks(TASKS, [1, 2, 3, 4])}
        for t in tasks.values():
            store.add_task(t.name, str(t.path), t.sha256, t.source)
        judged(store, "1_Scale", "slow = 1\n", fake_ok(2.0))
        best = judged(store, "1_Scale", GOOD, fake_ok(5.0))
        judged(store, "1_Scale", "wrong = 1\n", Verdict(status="incorrect"))
        store.set_state("1_Scale", "baseline",
                        fake_baseline(tasks["1_Scale"], 2.5).model_dump(mode="json"))
        judged(store, "2_Softplus", "a = 1\n", Verdict(status="incorrect"))
        judged(store, "2_Softplus", "b = 1\n", Verdict(status="crashed"))
        judged(store, "2_Softplus", "c = 1\n", Verdict(status="incorrect"))
        store.set_state("3_RowSum", "error", "reference failed in phase 'check'")
    (run_dir / "best_id").write_text(str(best))
    return run_dir


def test_write_set_lists_every_task_and_claims_the_honest_geomean(run: Path,
                                                                  tmp_path: Path) -> None:
    with RunStore.open(run) as store:
        folder = write_set(store, tmp_path / "set")
    best_id = int((run / "best_id").read_text())
    assert sorted(p.name for p in folder.iterdir()) == ["1_Scale.py", MANIFEST]
    assert (folder / "1_Scale.py").read_text() == GOOD  # the judged source, byte for byte
    manifest = json.loads((folder / MANIFEST).read_text())
    assert (manifest["format"], manifest["version"]) == ("pike-solution-set", 1)
    assert manifest["source_run"] == str(run.resolve())
    # 5x on one task of four; the three others count 1.0x
    assert manifest["claimed_geomean"] == pytest.approx(5.0 ** 0.25)
    assert manifest["claimed_geomean_method"] == CLAIMED_METHOD
    entries = {e["task"]: e for e in manifest["tasks"]}
    assert list(entries) == ["1_Scale", "2_Softplus", "3_RowSum", "4_Negate"]
    one = entries["1_Scale"]
    assert (one["file"], one["status"], one["candidate_id"]) == ("1_Scale.py", "ok", best_id)
    assert one["speedup_vs_eager"] == 5.0
    assert one["compile_speedups"] == {"compile:default": pytest.approx(2.0)}  # 5 / 2.5
    assert one["task_sha256"] == Task.from_file(TASKS / "1_Scale.py").sha256
    assert (one["device"], one["trials_passed"], one["trials"]) == ("cpu", 2, 2)
    assert one["date"] and "torch_version" in one and "device_name" in one
    assert entries["2_Softplus"]["file"] is None
    assert entries["2_Softplus"]["status"] == "failed"
    assert "3" in entries["2_Softplus"]["detail"] and "1 crashed" in entries["2_Softplus"]["detail"]
    assert (entries["3_RowSum"]["status"], entries["4_Negate"]["status"]) == ("error",
                                                                             "no_candidates")
    assert entries["2_Softplus"]["compile_speedups"] == {}


def test_update_set_keeps_one_set_over_runs_of_one_task_each(run: Path,
                                                              tmp_path: Path) -> None:
    # as bench/offline.py keeps it: each task searched in a run of its own
    folder = tmp_path / "set"
    with RunStore.open(run) as store:
        update_set(store, folder, tasks=["1_Scale", "2_Softplus"])
    other = tmp_path / "run2"
    task4 = load_tasks(TASKS, [4])[0]
    with RunStore.create(other, RunConfig().model_dump(mode="json"), "pike optimize") as store:
        store.add_task(task4.name, str(task4.path), task4.sha256, task4.source)
        judged(store, task4.name, "negated = 1\n", fake_ok(4.0))
        update_set(store, folder)
    manifest = read_set(folder)
    assert [e.task for e in manifest.tasks] == ["1_Scale", "2_Softplus", "4_Negate"]
    assert {e.task: e.source_run for e in manifest.tasks} == {
        "1_Scale": str(run.resolve()), "2_Softplus": str(run.resolve()),
        "4_Negate": str(other.resolve())}
    assert manifest.source_run == ""  # entries of two runs
    assert manifest.claimed_geomean == pytest.approx((5.0 * 1.0 * 4.0) ** (1 / 3))
    assert (folder / "4_Negate.py").read_text() == "negated = 1\n"
    # the task run again with no correct candidate: its entry and file go, the rest stay
    again = tmp_path / "run3"
    with RunStore.create(again, RunConfig().model_dump(mode="json"), "pike optimize") as store:
        store.add_task(task4.name, str(task4.path), task4.sha256, task4.source)
        judged(store, task4.name, "x = 1\n", Verdict(status="incorrect"))
        update_set(store, folder)
    manifest = read_set(folder)
    assert manifest.entry("4_Negate").status == "failed"
    assert sorted(p.name for p in folder.iterdir()) == ["1_Scale.py", MANIFEST]
    assert manifest.claimed_geomean == pytest.approx(5.0 ** (1 / 3))
    assert not manifest.modified_files(folder)


def test_read_set_round_trips_and_refuses_broken_sets(run: Path, tmp_path: Path) -> None:
    with RunStore.open(run) as store:
        folder = write_set(store, tmp_path / "set")
        with pytest.raises(ConfigError, match="already holds a solution set"):
            write_set(store, folder)
    manifest = read_set(folder)
    assert isinstance(manifest, SolutionSet)
    assert manifest == SolutionSet.model_validate_json((folder / MANIFEST).read_text())
    assert manifest.entry("1_Scale").file == "1_Scale.py"
    assert manifest.modified_files(folder) == []
    (folder / "1_Scale.py").write_text(GOOD + "\n# edited\n")
    assert manifest.modified_files(folder) == ["1_Scale.py"]

    raw = json.loads((folder / MANIFEST).read_text())

    def broken(change: dict, words: str) -> None:
        bad = tmp_path / f"bad-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(folder, bad)
        (bad / MANIFEST).write_text(json.dumps({**raw, **change}))
        with pytest.raises(ConfigError, match=words):
            read_set(bad)

    first = raw["tasks"][0]
    broken({"format": "something-else"}, "not a pike solution set")
    broken({"version": 3}, "newer than this pike reads")
    broken({"tasks": [first, first]}, "listed twice")
    broken({"tasks": [{**first, "file": "../1_Scale.py"}]}, "not a .py file name")
    broken({"tasks": [{**first, "file": "gone.py"}]}, "gone.py is not in")
    broken({"tasks": [{**first, "file": None}]}, "status ok without a file")
    broken({"claimed_geomean": "high"}, "claimed_geomean")
    with pytest.raises(ConfigError, match="no manifest.json"):
        read_set(tmp_path)


def test_audit_of_a_written_set_uses_its_manifest(run: Path, tmp_path: Path,
                                                  build_cache: Path) -> None:
    with RunStore.open(run) as store:
        folder = write_set(store, tmp_path / "set")
    (folder / "task_2.py").write_text("stray = 1\n")  # a manifest maps files: no guessing
    result = audit(folder, TASKS, audit_config(build_cache), out=tmp_path / "audit", ids=[1, 2])
    assert result.matched_by == MANIFEST
    t = by_task(result)
    assert (t["1_Scale"].file, t["1_Scale"].status) == ("1_Scale.py", "ok")
    assert t["1_Scale"].claimed_speedup == 5.0
    assert (t["2_Softplus"].file, t["2_Softplus"].status) == (None, "missing")
    agg = result.aggregates
    # the claim over the two tasks audited, not the set's four: like against like
    assert agg.claimed_geomean == pytest.approx(5.0 ** 0.5)
    assert agg.claimed_source.startswith(MANIFEST)
    assert "over the 2 tasks audited here, of the set's 4" in agg.claimed_source
    scale = t["1_Scale"]  # withheld as noisy on a loaded host: counted 1.0x, with why
    assert scale.speedup is not None or scale.withheld
    assert agg.geomean_all == pytest.approx((scale.speedup or 1.0) ** 0.5)
    whole = audit(folder, TASKS, audit_config(build_cache), out=tmp_path / "whole",
                  ids=[1, 2, 3, 4])
    assert whole.aggregates.claimed_geomean == pytest.approx(5.0 ** 0.25)
    assert "audited here" not in (whole.aggregates.claimed_source or "")


def test_audit_refuses_a_changed_task_unless_allowed(run: Path, tmp_path: Path,
                                                     build_cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with RunStore.open(run) as store:
        folder = write_set(store, tmp_path / "set")
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS, tasks)
    with (tasks / "1_Scale.py").open("a") as f:
        f.write("\n# edited after the set was judged\n")
    cfg = audit_config(build_cache)
    with pytest.raises(TaskError, match="1_Scale: the task file differs"):
        audit(folder, tasks, cfg, out=tmp_path / "refused", ids=[1, 2])
    assert not (tmp_path / "refused").exists()  # refused before anything ran

    FakeJudge({}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    (folder / "1_Scale.py").write_text(GOOD + "\n# edited\n")
    result = audit(folder, tasks, cfg, out=tmp_path / "allowed", ids=[1, 2],
                   allow_changed_tasks=True)
    t = by_task(result)
    assert t["1_Scale"].task_changed and not t["2_Softplus"].task_changed
    assert any("1_Scale: the task file differs" in w for w in result.warnings)
    assert any("1_Scale.py: changed since the set's manifest" in w for w in result.warnings)
    assert t["1_Scale"].speedup == 3.0


def test_audit_of_a_plain_folder_takes_no_claim_from_nowhere(tmp_path: Path, build_cache: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    FakeJudge({}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "task_1.py").write_text(GOOD)
    result = audit(folder, TASKS, audit_config(build_cache), out=tmp_path / "a", ids=[1])
    assert result.matched_by == "file names"
    assert result.aggregates.claimed_geomean is None
    assert result.tasks[0].claimed_speedup is None
    (folder / "claimed.json").write_text('{"geomean": "fast"}')
    with pytest.raises(ConfigError, match="claimed.json"):
        audit(folder, TASKS, audit_config(build_cache), out=tmp_path / "b", ids=[1])


def test_a_best_slower_than_eager_keeps_the_reference(tmp_path: Path, build_cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H100's level1 bench a CUDA graph around a 4 GiB output ran at 0.59x and was
    the set's file; a user keeps the reference instead, and the set says why."""
    run_dir = tmp_path / "run"
    with RunStore.create(run_dir, RunConfig().model_dump(mode="json"), "pike bench") as store:
        for t in load_tasks(TASKS, [1, 2]):
            store.add_task(t.name, str(t.path), t.sha256, t.source)
        judged(store, "1_Scale", "slowest = 1\n", fake_ok(0.4))
        slow = judged(store, "1_Scale", GOOD, fake_ok(0.59))
        judged(store, "2_Softplus", GOOD, fake_ok(1.0))  # as fast as eager: kept
        folder = write_set(store, tmp_path / "set")
        no_slower = update_set(store, tmp_path / "no-slower", ["2_Softplus"])
    manifest = read_set(folder)
    entry = manifest.entry("1_Scale")
    assert (entry.status, entry.file, entry.candidate_id) == ("slower", None, slow)
    assert entry.speedup_vs_eager is None
    assert "0.59x of eager" in entry.detail and "reference is kept" in entry.detail
    assert manifest.entry("2_Softplus").status == "ok"
    assert not (folder / "1_Scale.py").exists()
    assert manifest.claimed_geomean == pytest.approx(1.0)
    # `slower` came with format version 2: a pike before it says "upgrade pike" instead of
    # failing on the status; a set without it stays version 1, which that pike reads
    assert manifest.version == 2
    assert read_set(no_slower).version == 1
    # the audit says why the task has no file, and counts it 1.0x
    FakeJudge({}, {"2_Softplus": fake_ok(1.1)}).install(monkeypatch)
    result = audit(folder, TASKS, audit_config(build_cache), out=tmp_path / "audit")
    t = by_task(result)
    assert t["1_Scale"].status == "missing" and "reference is kept" in t["1_Scale"].message
    assert result.aggregates.geomean_all == pytest.approx(1.1 ** 0.5)


def test_an_audit_of_a_set_takes_the_set_s_tasks_unless_told(
        run: Path, tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set of 20 tasks of level1's 89 was audited over all 89 on the H100: 69 more
    files missing, counted 1.0x, and the device time of walking them."""
    with RunStore.open(run) as store:
        folder = write_set(store, tmp_path / "set")
    FakeJudge({}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    result = audit(folder, TASKS, audit_config(build_cache), out=tmp_path / "a")
    # the set's four of the folder's five (10_Square is not in the run)
    assert sorted(by_task(result)) == ["1_Scale", "2_Softplus", "3_RowSum", "4_Negate"]
    assert "the set's 4 tasks audited, of the task folder's 5 (--tasks audits others)" \
        in result.warnings
    assert "audited here" not in (result.aggregates.claimed_source or "")
    # --tasks still audits what it names, in the set or not
    told = audit(folder, TASKS, audit_config(build_cache), out=tmp_path / "b", ids=[1, 10])
    assert sorted(by_task(told)) == ["10_Square", "1_Scale"]
    # a task of the manifest the folder lacks is said, not silently dropped
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS, tasks)
    (tasks / "4_Negate.py").unlink()
    fewer = audit(folder, tasks, audit_config(build_cache), out=tmp_path / "c")
    assert "4_Negate" not in by_task(fewer)
    assert any(w.startswith("4_Negate: in the set's manifest, but no such task")
               for w in fewer.warnings)


def test_a_set_s_audit_resumed_or_gathered_keeps_to_the_set_s_tasks(
        run: Path, tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """helper-71: `--combine` still took the whole folder, and an audit begun before
    sets were audited over their own tasks would, resumed, have dropped tasks it judged."""
    from pike.audit import resume_audit
    from pike.audit.combine import combine
    from pike.audit.run import ASKED_STATE, RUN_STATE, SET_TASKS
    with RunStore.open(run) as store:
        folder = write_set(store, tmp_path / "set")
    FakeJudge({}, {"1_Scale": fake_ok(3.0)}).install(monkeypatch)
    cfg = audit_config(build_cache)
    audit(folder, TASKS, cfg, out=tmp_path / "a", ids=[1, 2])
    audit(folder, TASKS, cfg, out=tmp_path / "b", ids=[3, 4])
    both = combine(folder, TASKS, [tmp_path / "a", tmp_path / "b"], out=tmp_path / "ab")
    assert sorted(by_task(both)) == ["1_Scale", "2_Softplus", "3_RowSum", "4_Negate"]
    assert both.open_tasks == []
    assert "the set's 4 tasks audited, of the task folder's 5 (--tasks audits others)" \
        in both.warnings
    # a file-less task says the set's reason, gathered as audited
    assert "no correct, timed candidate" in by_task(both)["2_Softplus"].message

    whole = audit(folder, TASKS, cfg, out=tmp_path / "new")
    with RunStore.open(tmp_path / "new") as store:
        asked = store.get_state(RUN_STATE, ASKED_STATE)
        assert asked[SET_TASKS] is True
        del asked[SET_TASKS]  # as an audit begun before recorded it
        store.set_state(RUN_STATE, ASKED_STATE, asked)
    again = resume_audit(tmp_path / "new")
    assert sorted(by_task(again)) == sorted([*by_task(whole), "10_Square"])
