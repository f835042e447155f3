"""The run store keeps what a run did, so it can be resumed, reported and audited."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pike import store_schema
from pike.errors import StoreError
from pike.evaluate.verdict import TimingStats, Verdict
from pike.store import STORE_FILE, RunStore

CONFIG = {"model": "gpt-x", "budget": {"queries": 300, "dollars": 5.0}, "strategy": "branching"}
COMMAND = "pike optimize examples/tasks --strategy branching"


@dataclass
class FakeCall:
    """Stands in for pike.llm.LLMCall: the attributes the store reads."""

    role: str = "optimizer"
    model: str = "gpt-x"
    messages: list[dict] = field(default_factory=lambda: [{"role": "user", "content": "go"}])
    reply: str | None = "class ModelNew: ..."
    tokens_in: int = 100
    tokens_out: int = 50
    latency_s: float = 1.5
    cost_usd: float = 0.01
    error: str | None = None
    started_at: str = "2025-01-01T00:00:00+00:00"


def ok(median_ms: float, reference_ms: float = 10.0) -> Verdict:
    runtime = TimingStats.from_samples([median_ms * 0.9, median_ms, median_ms * 1.1])
    reference = TimingStats.from_samples([reference_ms])
    return Verdict(status="ok", trials=5, trials_passed=5, runtime=runtime, reference=reference,
                   speedup=reference_ms / median_ms, device="cpu")


@pytest.fixture
def store(tmp_path: Path):
    with RunStore.create(tmp_path / "run", CONFIG, COMMAND) as s:
        yield s


def test_create_then_open_keeps_config_and_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "nested" / "run"
    created = RunStore.create(run_dir, CONFIG, COMMAND)
    assert created.path == run_dir / STORE_FILE
    created.add_task("1_GeluMLP", "examples/tasks/1_GeluMLP.py", "ab" * 32, "class Model: ...")
    created.close()

    reopened = RunStore.open(run_dir)
    assert reopened.config() == CONFIG
    assert reopened.command() == COMMAND
    assert reopened.tasks() == [{
        "name": "1_GeluMLP", "path": "examples/tasks/1_GeluMLP.py", "sha256": "ab" * 32,
        "source": "class Model: ...", "added_at": reopened.tasks()[0]["added_at"],
    }]
    reopened.close()


def test_store_is_wal_and_syncs_every_commit(store: RunStore) -> None:
    with store._db() as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_create_over_an_existing_run_is_refused(store: RunStore) -> None:
    with pytest.raises(StoreError, match="already exists"):
        RunStore.create(store.path.parent, {}, "pike optimize")
    assert store.config() == CONFIG  # the existing run is untouched


def test_a_config_that_cannot_be_stored_leaves_no_run_behind(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not JSON"):
        RunStore.create(tmp_path, {"cache": Path("/tmp")}, "pike optimize")
    assert not (tmp_path / STORE_FILE).exists()


def test_open_missing_run_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as info:
        RunStore.open(tmp_path / "nowhere")
    assert "no pike run" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "nowhere").exists()  # opening creates nothing


@pytest.mark.parametrize("content", [b"not a database at all" * 10, b""])
def test_open_a_file_that_is_not_a_pike_run(tmp_path: Path, content: bytes) -> None:
    (tmp_path / STORE_FILE).write_bytes(content)
    with pytest.raises(StoreError, match="not a pike run") as info:
        RunStore.open(tmp_path)
    assert "\n" not in str(info.value)


def test_open_leaves_a_foreign_database_as_it_was(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / STORE_FILE)
    with conn:
        conn.execute("CREATE TABLE other (x)")
    conn.close()
    with pytest.raises(StoreError, match="not a pike run"):
        RunStore.open(tmp_path)
    conn = sqlite3.connect(tmp_path / STORE_FILE)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_task_is_added_once_and_a_changed_task_is_refused(store: RunStore) -> None:
    store.add_task("t", "t.py", "1" * 64, "src")
    store.add_task("t", "t.py", "1" * 64, "src")
    assert [t["name"] for t in store.tasks()] == ["t"]
    with pytest.raises(StoreError, match="changed"):
        store.add_task("t", "t.py", "2" * 64, "edited src")


def test_candidates_keep_lineage_and_verdicts(store: RunStore) -> None:
    call_id = store.record_llm_call("t", FakeCall())
    ref = store.add_candidate("t", "reference", parent_id=None, role="reference", round=0,
                              branch=0)
    child = store.add_candidate("t", "child", parent_id=ref, role="optimize", round=1, branch=2,
                                idea="fuse gelu", llm_call_id=call_id)
    other = store.add_candidate("u", "other task", parent_id=None, role="offline", round=0,
                                branch=0)
    verdict = ok(4.0)
    store.set_verdict(child, verdict)

    row = store.candidate(child)
    assert (row.task, row.source, row.parent_id, row.role, row.round, row.branch) == (
        "t", "child", ref, "optimize", 1, 2)
    assert row.idea == "fuse gelu" and row.llm_call_id == call_id
    assert row.verdict == verdict
    assert row.created_at.endswith("+00:00")
    assert store.candidate(ref).verdict is None
    assert [c.id for c in store.candidates("t")] == [ref, child]
    assert [c.id for c in store.candidates()] == [ref, child, other]


def test_unknown_candidate_or_parent_is_a_store_error(store: RunStore) -> None:
    with pytest.raises(StoreError, match="no candidate 42"):
        store.candidate(42)
    with pytest.raises(StoreError, match="no candidate 42"):
        store.set_verdict(42, ok(1.0))
    with pytest.raises(StoreError, match="not in this run"):
        store.add_candidate("t", "x", parent_id=42, role="optimize", round=1, branch=0)


def test_pending_lists_only_unevaluated_candidates_of_the_task(store: RunStore) -> None:
    ids = [store.add_candidate("t", f"c{i}", parent_id=None, role="optimize", round=1, branch=i)
           for i in range(4)]
    store.add_candidate("u", "elsewhere", parent_id=None, role="optimize", round=1, branch=0)
    store.set_verdict(ids[0], ok(2.0))
    store.set_verdict(ids[2], Verdict(status="compile_error", message="boom", phase="load"))
    assert [c.id for c in store.pending("t")] == [ids[1], ids[3]]


def test_spent_counts_every_call_of_the_task_failed_ones_included(store: RunStore) -> None:
    store.record_llm_call("t", FakeCall(cost_usd=0.25))
    store.record_llm_call("t", FakeCall(reply=None, error="HTTP 500", tokens_out=0,
                                        cost_usd=0.5))
    store.record_llm_call("t", FakeCall(reply=None, error="timeout", cost_usd=None))
    store.record_llm_call("u", FakeCall(cost_usd=10.0))
    queries, dollars = store.spent("t")
    assert queries == 3 and dollars == pytest.approx(0.75)
    assert store.spent("nothing yet") == (0, 0.0)


def test_llm_calls_come_back_as_recorded(store: RunStore) -> None:
    messages = [{"role": "system", "content": "be fast"}, {"role": "user", "content": "go"}]
    call_id = store.record_llm_call("t", FakeCall(messages=messages, error="rate limited"))
    [call] = store.llm_calls("t")
    assert call["id"] == call_id and call["messages"] == messages
    assert (call["task"], call["role"], call["model"], call["error"]) == (
        "t", "optimizer", "gpt-x", "rate limited")
    assert (call["tokens_in"], call["tokens_out"], call["cost_usd"]) == (100, 50, 0.01)
    assert call["started_at"] == "2025-01-01T00:00:00+00:00"
    assert store.llm_calls("u") == [] and len(store.llm_calls()) == 1


def test_best_is_the_fastest_correct_candidate_other_than_the_reference(
        store: RunStore) -> None:
    def add(role: str, verdict: Verdict | None) -> int:
        cid = store.add_candidate("t", role, parent_id=None, role=role, round=1, branch=0)
        if verdict is not None:
            store.set_verdict(cid, verdict)
        return cid

    assert store.best("t") is None
    add("reference", ok(1.0))
    add("optimize", Verdict(status="incorrect", runtime=TimingStats.from_samples([0.5])))
    add("optimize", None)
    slow = add("optimize", ok(8.0))
    assert store.best("t").id == slow
    fast = add("fix", ok(3.0))
    add("optimize", ok(5.0))
    best = store.best("t")
    assert best.id == fast and best.verdict.runtime.median_ms == pytest.approx(3.0)
    assert store.best("u") is None


def test_best_ranks_by_the_speedup_measured_beside_the_reference(store: RunStore) -> None:
    # A timed while the host ran slow (its reference too): a longer runtime, a larger ratio.
    a = store.add_candidate("t", "a", parent_id=None, role="offline", round=0, branch=0)
    store.set_verdict(a, ok(1.0).model_copy(update={"speedup": 2.0}))
    b = store.add_candidate("t", "b", parent_id=None, role="offline", round=0, branch=1)
    store.set_verdict(b, ok(0.9).model_copy(update={"speedup": 1.5}))
    unrated = store.add_candidate("t", "c", parent_id=None, role="offline", round=0, branch=2)
    store.set_verdict(unrated, ok(0.1).model_copy(update={"speedup": None}))
    assert store.best("t").id == a


def test_state_round_trips_per_task(store: RunStore) -> None:
    assert store.get_state("t", "round") is None
    assert store.get_state("t", "round", default=0) == 0
    store.set_state("t", "round", 3)
    store.set_state("t", "round", 4)
    store.set_state("t", "frontier", {"ids": [1, 2], "temperature": 0.7})
    assert store.get_state("t", "round") == 4
    assert store.get_state("t", "frontier") == {"ids": [1, 2], "temperature": 0.7}
    assert store.get_state("u", "round") is None
    with pytest.raises(StoreError, match="not JSON"):
        store.set_state("t", "bad", object())


def test_concurrent_llm_calls_from_worker_threads_are_all_recorded(store: RunStore) -> None:
    threads, per_thread = 8, 25
    ids: list[int] = []
    ids_lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            cid = store.record_llm_call("t", FakeCall(role=f"w{n}", tokens_in=i, cost_usd=0.001))
            with ids_lock:
                ids.append(cid)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len(set(ids)) == threads * per_thread
    assert len(store.llm_calls("t")) == threads * per_thread
    queries, dollars = store.spent("t")
    assert queries == threads * per_thread and dollars == pytest.approx(0.2)


def test_every_returned_candidate_survives_kill_9(tmp_path: Path) -> None:
    """A run killed at an arbitrary moment keeps every candidate whose write returned."""
    run_dir = tmp_path / "run"
    child = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        from pathlib import Path
        from pike.store import RunStore
        store = RunStore.create(Path({str(run_dir)!r}), {{}}, "pike optimize")
        def kill_soon():
            while store.get_state("t", "written", 0) < 20:
                time.sleep(0.005)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=kill_soon, daemon=True).start()
        for i in range(100_000):
            cid = store.add_candidate("t", "x" * 2000, parent_id=None, role="optimize",
                                      round=i, branch=0)
            sys.stdout.write(f"{{cid}}\\n")
            sys.stdout.flush()
            store.set_state("t", "written", i + 1)
        print("finished without being killed")
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    printed = [int(line) for line in proc.stdout.split()]
    assert len(printed) >= 20

    reopened = RunStore.open(run_dir)
    stored = [c.id for c in reopened.candidates("t")]
    assert stored[: len(printed)] == printed
    # At most the one write that returned while the kill landed before its print.
    assert len(stored) - len(printed) <= 1
    with reopened._db() as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    reopened.close()


def set_schema_version(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.close()


def test_a_store_from_a_newer_pike_is_refused(store: RunStore) -> None:
    store.close()
    set_schema_version(store.path, 99)
    with pytest.raises(StoreError, match="newer") as info:
        RunStore.open(store.path.parent)
    assert "\n" not in str(info.value)


def test_an_older_store_is_migrated_on_open(store: RunStore,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cid = store.add_candidate("t", "src", parent_id=None, role="optimize", round=0, branch=0)
    store.close()

    def add_notes(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE candidates ADD COLUMN notes TEXT NOT NULL DEFAULT ''")

    monkeypatch.setattr(store_schema, "_MIGRATIONS", [*store_schema._MIGRATIONS, add_notes])
    newer = str(store_schema.SCHEMA_VERSION + 1)
    with RunStore.open(store.path.parent) as migrated:
        assert migrated._meta("schema_version") == newer
        assert migrated.candidate(cid).source == "src"
        with migrated._db() as db:
            assert db.execute("SELECT notes FROM candidates").fetchone()[0] == ""
    with RunStore.open(store.path.parent) as again:  # already current: nothing to do
        assert again._meta("schema_version") == newer


def test_a_closed_store_says_so(store: RunStore) -> None:
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.candidates()


def test_a_call_is_counted_before_it_is_sent_and_stays_counted_after_a_crash(
        tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pike.search.ledger import Ledger

    store = RunStore.create(tmp_path / "run", {}, "test")
    ledger = Ledger(store, "t", budget_queries=2, budget_dollars=1.0)
    first = ledger.reserve(0.4)
    assert first is not None and store.spent("t") == (1, 0.4)  # in flight: counted
    second = ledger.reserve(0.4)
    assert second is not None and ledger.reserve(0.1) is None  # no room for a third
    call = SimpleNamespace(role="optimize:0", model="m", messages=[], reply="r", tokens_in=1,
                           tokens_out=1, latency_s=0.1, cost_usd=0.25, error=None)
    assert ledger.settle(first, call) is not None
    assert store.spent("t") == (2, pytest.approx(0.65))  # recorded + still in flight
    # The process dies here with `second` in flight; a resumed run sees it as spent.
    resumed = Ledger(RunStore.open(tmp_path / "run"), "t", budget_queries=2,
                     budget_dollars=1.0)
    assert resumed.reserve(0.01) is None
    # A reservation given back unsent frees its room.
    assert ledger.settle(second, None) is None and resumed.reserve(0.01) is not None
