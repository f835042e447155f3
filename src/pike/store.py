"""The run store: one SQLite file per run holding tasks, candidates with their lineage and
verdicts, every LLM call with tokens and cost, and resume markers.

Events are written as they happen, each in its own transaction committed before the call
returns, so that a run killed at any moment (even `kill -9`) can be resumed, replayed,
reported and audited from what it had recorded. The store only stores: population logic
belongs to the strategies.

The schema and its migrations are in pike.store_schema, the row models and encodings in
pike.store_rows.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pike.errors import StoreError
from pike.evaluate.verdict import Verdict, says_out_of_memory
from pike.store_rows import CandidateRow, _candidate_row, _now, _timestamp, _to_json
from pike.store_schema import _SCHEMA_V1, _configure, _connect, _migrate, _schema_version, _uri

STORE_FILE = "run.sqlite"

# Task-state keys that campaigns and audits write and `show`, `report` and sets read.
BASELINE_STATE = "baseline"  # Baseline.model_dump(mode="json"): eager and compile modes
DONE_STATE = "done"  # the task needs no more work (a campaign's resume skips it)
ERROR_STATE = "error"  # why the task was given up (its reference failed)
# {"reference": bytes, "candidate": bytes}: the most its children took on the host (RSS
# and files in memory, evaluate/host_memory), recalled by a resumed run's gate
FOOTPRINT_STATE = "host_footprint"
MISSING_STATE = "missing"  # an audited set had no file for the task


class RunStore:
    """The SQLite file of one run. Safe to share between threads; every write is committed
    before the method returns."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def create(cls, run_dir: Path, config: dict, command: str) -> RunStore:
        """Start a new run in run_dir (made if missing); refuse to overwrite an existing one."""
        run_dir = Path(run_dir)
        path = run_dir / STORE_FILE
        config_json = _to_json(config, "run config")
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            # O_EXCL claims the file atomically, so two runs started on one folder cannot
            # both think they created it. SQLite treats the empty file as a new database.
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            raise StoreError(
                f"a pike run already exists at {run_dir}; resume it or pick another folder"
            ) from None
        except OSError as e:
            raise StoreError(f"cannot create a run store at {run_dir}: {e.strerror}") from None
        conn = _connect(_uri(path, "rw"))
        try:
            _configure(conn, path)
            # One transaction: the schema and its version appear together or not at all.
            conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA_V1)
            meta = {"schema_version": "1", "created_at": _now(), "command": command,
                    "config": config_json}
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
            conn.execute("COMMIT")
            _migrate(conn, path)
        except BaseException:
            # A half-made store would later read as "not a pike run"; leave nothing behind.
            conn.close()
            for suffix in ("", "-wal", "-shm"):
                path.with_name(path.name + suffix).unlink(missing_ok=True)
            raise
        return cls(path, conn)

    @classmethod
    def open(cls, run_dir: Path) -> RunStore:
        """Open an existing run (to resume or report it), migrating an older schema."""
        path = Path(run_dir) / STORE_FILE
        if not path.is_file():
            raise StoreError(f"no pike run at {run_dir} ({STORE_FILE} not found)")
        try:
            conn = _connect(_uri(path, "rw"))
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open the run store {path}: {e}") from None
        try:
            _schema_version(conn, path)  # a file that is not ours is left as it was
            _configure(conn, path)
            _migrate(conn, path)
        except BaseException:
            conn.close()
            raise
        return cls(path, conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """The connection, held under the lock for the duration of one statement or read."""
        with self._lock:
            if self._conn is None:
                raise StoreError(f"run store {self.path} is closed")
            yield self._conn

    # -- the run -------------------------------------------------------------------------

    def _meta(self, key: str) -> str:
        with self._db() as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise StoreError(f"{self.path} is damaged: no {key} recorded")
        return row[0]

    def config(self) -> dict:
        return json.loads(self._meta("config"))

    def command(self) -> str:
        """The command line that started the run."""
        return self._meta("command")

    def created_at(self) -> str:
        return self._meta("created_at")

    # -- tasks ---------------------------------------------------------------------------

    def add_task(self, name: str, path: str, sha256: str, source: str) -> None:
        """Record a task once; adding it again is a no-op, but not if its source changed,
        since candidates judged against two references cannot be compared."""
        with self._db() as db:
            db.execute(
                "INSERT OR IGNORE INTO tasks (name, path, sha256, source, added_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (name, str(path), sha256, source, _now()),
            )
            row = db.execute("SELECT sha256 FROM tasks WHERE name = ?", (name,)).fetchone()
        if row[0] != sha256:
            raise StoreError(
                f"task {name} changed since this run recorded it "
                f"(sha256 {row[0][:12]} then, {sha256[:12]} now)"
            )

    def tasks(self) -> list[dict]:
        with self._db() as db:
            rows = db.execute(
                "SELECT name, path, sha256, source, added_at FROM tasks ORDER BY rowid"
            ).fetchall()
        return [dict(row) for row in rows]

    # -- candidates ----------------------------------------------------------------------

    def add_candidate(
        self,
        task: str,
        source: str,
        *,
        parent_id: int | None,
        role: str,
        round: int,
        branch: int,
        idea: str = "",
        llm_call_id: int | None = None,
    ) -> int:
        try:
            with self._db() as db:
                cursor = db.execute(
                    "INSERT INTO candidates (task, source, parent_id, role, round, branch, idea,"
                    " llm_call_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (task, source, parent_id, role, round, branch, idea, llm_call_id, _now()),
                )
        except sqlite3.IntegrityError:
            raise StoreError(
                f"candidate of {task}: parent {parent_id} or LLM call {llm_call_id} "
                "is not in this run"
            ) from None
        return int(cursor.lastrowid)

    def set_verdict(self, candidate_id: int, verdict: Verdict) -> None:
        runtime_ms = verdict.runtime.median_ms if verdict.runtime is not None else None
        with self._db() as db:
            cursor = db.execute(
                "UPDATE candidates SET verdict = ?, status = ?, runtime_ms = ?, speedup = ?,"
                " evaluated_at = ? WHERE id = ?",
                (verdict.model_dump_json(), verdict.status, runtime_ms, verdict.speedup,
                 _now(), candidate_id),
            )
        if cursor.rowcount == 0:
            raise StoreError(f"no candidate {candidate_id} in this run")

    def candidates(self, task: str | None = None) -> list[CandidateRow]:
        """Every candidate (of one task, if given), oldest first."""
        return self._candidates("1" if task is None else "task = ?", () if task is None else (task,))

    def candidate(self, candidate_id: int) -> CandidateRow:
        rows = self._candidates("id = ?", (candidate_id,))
        if not rows:
            raise StoreError(f"no candidate {candidate_id} in this run")
        return rows[0]

    def pending(self, task: str) -> list[CandidateRow]:
        """Candidates recorded but not yet judged: a resumed run evaluates these first."""
        return self._candidates("task = ? AND verdict IS NULL", (task,))

    def best(self, task: str) -> CandidateRow | None:
        """The fastest correct candidate of a task; the reference itself does not count.

        Where the search's top candidates were timed again in one window (its "confirmed"
        state, search/confirm_best.py), the fastest there, with that window's speedup
        and runtime (`confirmed`, the search's own figure as `search_speedup`). Otherwise
        fastest by speedup: each is a ratio to the reference timed in the same window, so it
        compares evaluations made minutes apart on a drifting host (and what the searches
        rank by); the runtime only breaks ties or stands in where no speedup was measured.
        A `noisy` verdict is never the best, nor one whose window was cut short
        (`timed_rounds`: too few calls for some of the timing guards).
        """
        confirmed, passed_over = self._confirmation(task)
        if confirmed is not None:
            return confirmed
        rows = self._candidates(
            "task = ? AND status = 'ok' AND role != 'reference' AND runtime_ms IS NOT NULL"
            " AND COALESCE(json_extract(verdict, '$.noisy'), 0) = 0"
            " AND json_extract(verdict, '$.timed_rounds') IS NULL"
            " ORDER BY speedup IS NULL, speedup DESC, runtime_ms, id",
            (task,),
            order=False,
        )
        return next((r for r in rows if r.id not in passed_over), None)

    def _confirmation(self, task: str) -> tuple[CandidateRow | None, set[int]]:
        """The confirming window's best, with its figures; or None, and the candidates the
        search's own figures pass over: where the window timed a best but is set aside
        because a candidate above it ran out of memory there (_ran_out_above), those that
        failed in it for another reason (a crash, a failed load). A window that timed
        none (level1's 98: "not timed" beside four out of GPU memory) tells nothing of
        any one of them."""
        kept = self.get_state(task, "confirmed")
        figures = [f for f in (kept.get("figures", []) if isinstance(kept, dict) else [])
                   if isinstance(f, dict)]
        first = next((f for f in figures if f.get("speedup")), None)
        if first is None:
            return None, set()
        row = self.candidate(int(first["candidate_id"]))
        v = row.verdict
        if self._ran_out_above(figures, (v.speedup or 0.0) if v is not None else 0.0):
            return None, {int(f["candidate_id"]) for f in figures if not f.get("speedup")
                          and not f.get("caught") and not says_out_of_memory(f.get("error"))}
        if v is None:
            return None, set()
        runtime = (v.runtime.model_copy(update={"median_ms": first["runtime_ms"]})
                   if v.runtime else None)
        # eager's median in the same window, so runtime, reference and speedup agree
        reference = (v.reference.model_copy(update={"median_ms": first["reference_ms"]})
                     if v.reference and first.get("reference_ms") else v.reference)
        # timed in full there: a search window cut short (behind its best), or shared
        # with other candidates, no longer describes the figure
        return row.model_copy(update={"verdict": v.model_copy(update={
            "confirmed": True, "search_speedup": v.speedup, "speedup": first["speedup"],
            "runtime": runtime, "reference": reference, "timed_rounds": None,
            "behind_best": None, "window_candidates": None})}), set()

    def _ran_out_above(self, figures: list[dict], searched: float) -> bool:
        """A candidate of the confirming window ran out of memory there (the GPU's, or
        the host's: the window holds several at once) and had a search figure above
        `searched`, the confirmed best's: the window cannot say which is faster, and the
        task's best is left to the search's own figures (search/confirm_best.py)."""
        for figure in figures:
            if figure.get("speedup") or figure.get("caught"):
                continue
            if not says_out_of_memory(figure.get("error")):
                continue
            failed = self.candidate(int(figure["candidate_id"])).verdict
            if failed is not None and (failed.speedup or 0.0) > searched:
                return True
        return False

    def _candidates(self, where: str, args: tuple, *, order: bool = True) -> list[CandidateRow]:
        sql = (
            "SELECT id, task, source, parent_id, role, round, branch, idea, llm_call_id,"
            f" created_at, verdict, evaluated_at FROM candidates WHERE {where}"
        )
        if order:
            sql += " ORDER BY id"
        with self._db() as db:
            rows = db.execute(sql, args).fetchall()
        return [_candidate_row(row) for row in rows]

    # -- LLM calls -----------------------------------------------------------------------

    def record_llm_call(self, task: str, call: Any) -> int:
        """Record one LLM call (an LLMCall or anything with its attributes), failed or not.

        Messages that hold something JSON cannot encode are kept as its text rather than
        refused: losing a call would undercount the budget.
        """
        row = self._llm_call_row(task, call)
        with self._db() as db:
            return self._insert_llm_call(db, row)

    @staticmethod
    def _llm_call_row(task: str, call: Any) -> tuple:
        error = getattr(call, "error", None)
        parts = getattr(call, "prompt_parts", None)
        if isinstance(parts, BaseModel):
            parts = parts.model_dump(mode="json")
        return (
            task,
            getattr(call, "role", None),
            getattr(call, "model", None),
            json.dumps(list(getattr(call, "messages", None) or []), default=str),
            getattr(call, "reply", None),
            getattr(call, "tokens_in", None),
            getattr(call, "tokens_out", None),
            getattr(call, "latency_s", None),
            getattr(call, "cost_usd", None),
            None if error is None else str(error),
            _timestamp(getattr(call, "started_at", None)),
            _now(),
            None if parts is None else json.dumps(parts, default=str),
        )

    @staticmethod
    def _insert_llm_call(db: sqlite3.Connection, row: tuple) -> int:
        cursor = db.execute(
            "INSERT INTO llm_calls (task, role, model, messages, reply, tokens_in,"
            " tokens_out, latency_s, cost_usd, error, started_at, recorded_at, prompt_parts)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            row,
        )
        return int(cursor.lastrowid)

    def reserve_call(self, task: str, reserved_usd: float) -> int:
        """Count a call before it is sent (its estimated cost reserved); `settle_call`
        replaces it by the recorded call. One left by a crash stays counted."""
        with self._db() as db:
            cursor = db.execute("INSERT INTO pending_calls (task, reserved_usd, started_at)"
                                " VALUES (?, ?, ?)", (task, reserved_usd, _now()))
        return int(cursor.lastrowid)

    def settle_call(self, pending_id: int, task: str, call: Any | None) -> int | None:
        """In one transaction: the reservation is dropped and the call (if any: None when
        nothing was sent) recorded; the recorded call's id."""
        row = self._llm_call_row(task, call) if call is not None else None
        with self._db() as db:
            db.execute("DELETE FROM pending_calls WHERE id = ?", (pending_id,))
            return self._insert_llm_call(db, row) if row is not None else None

    def llm_calls(self, task: str | None = None) -> list[dict]:
        sql = "SELECT * FROM llm_calls"
        args: tuple = ()
        if task is not None:
            sql += " WHERE task = ?"
            args = (task,)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY id", args).fetchall()
        calls = []
        for row in rows:
            call = dict(row)
            call["messages"] = json.loads(call["messages"])
            if call["prompt_parts"] is not None:
                call["prompt_parts"] = json.loads(call["prompt_parts"])
            calls.append(call)
        return calls

    def spent(self, task: str) -> tuple[int, float]:
        """(queries, dollars) spent on a task. Every recorded call counts, failed ones too:
        they were sent, and may have been billed; so does every call counted before it was
        sent and never recorded (in flight now, or at a crash), at its reserved cost."""
        with self._db() as db:
            queries, dollars = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(cost_usd), 0.0) FROM llm_calls WHERE task = ?",
                (task,),
            ).fetchone()
            pending, reserved = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(reserved_usd), 0.0) FROM pending_calls"
                " WHERE task = ?", (task,),
            ).fetchone()
        return int(queries) + int(pending), float(dollars) + float(reserved)

    # -- resume markers ------------------------------------------------------------------

    def set_state(self, task: str, key: str, value: object) -> None:
        encoded = _to_json(value, f"state {key!r} of {task}")
        with self._db() as db:
            db.execute(
                "INSERT INTO state (task, key, value) VALUES (?, ?, ?)"
                " ON CONFLICT (task, key) DO UPDATE SET value = excluded.value",
                (task, key, encoded),
            )

    def clear_state(self, task: str, *keys: str) -> None:
        with self._db() as db:
            db.executemany("DELETE FROM state WHERE task = ? AND key = ?",
                           [(task, key) for key in keys])

    def forget_task(self, task: str) -> dict[str, int]:
        """Drop everything recorded for `task` but the task itself (candidates, LLM calls
        and their reservations, resume markers and baselines), for a campaign that runs it
        again from the start; how many rows of each went."""
        gone = {}
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")  # all or nothing: no half-forgotten budget
            try:
                for table in ("candidates", "llm_calls", "pending_calls", "state"):
                    gone[table] = db.execute(f"DELETE FROM {table} WHERE task = ?",
                                             (task,)).rowcount
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return gone

    def get_state(self, task: str, key: str, default: object = None) -> object:
        with self._db() as db:
            row = db.execute(
                "SELECT value FROM state WHERE task = ? AND key = ?", (task, key)
            ).fetchone()
        return default if row is None else json.loads(row[0])
