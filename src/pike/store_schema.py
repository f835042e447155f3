"""The run store's SQLite file: its schema, versioned, the migrations that bring an older
store up to the current version, and how a connection to it is opened and set up.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from pike.errors import StoreError

log = logging.getLogger(__name__)

# How long a writer waits for another process holding the write lock (a report reading a
# live run never blocks in WAL mode, but two writers can meet).
_BUSY_TIMEOUT_S = 30.0

_SCHEMA_V1 = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE tasks (
    name     TEXT PRIMARY KEY,
    path     TEXT NOT NULL,
    sha256   TEXT NOT NULL,
    source   TEXT NOT NULL,
    added_at TEXT NOT NULL
);
CREATE TABLE llm_calls (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task        TEXT NOT NULL,
    role        TEXT,
    model       TEXT,
    messages    TEXT NOT NULL,
    reply       TEXT,
    tokens_in   INTEGER,
    tokens_out  INTEGER,
    latency_s   REAL,
    cost_usd    REAL,
    error       TEXT,
    started_at  TEXT,
    recorded_at TEXT NOT NULL
);
CREATE INDEX llm_calls_task ON llm_calls (task);
CREATE TABLE candidates (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task        TEXT NOT NULL,
    source      TEXT NOT NULL,
    parent_id   INTEGER REFERENCES candidates (id),
    role        TEXT NOT NULL,
    round       INTEGER NOT NULL,
    branch      INTEGER NOT NULL,
    idea        TEXT NOT NULL DEFAULT '',
    llm_call_id INTEGER REFERENCES llm_calls (id),
    created_at  TEXT NOT NULL,
    -- the Verdict as JSON; the columns after it copy fields of it so queries need no JSON
    verdict     TEXT,
    status      TEXT,
    runtime_ms  REAL,
    speedup     REAL,
    evaluated_at TEXT
);
CREATE INDEX candidates_task ON candidates (task, status);
CREATE TABLE state (
    task  TEXT NOT NULL,
    key   TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (task, key)
);
"""

Migration = Callable[[sqlite3.Connection], None]


def _add_prompt_parts(conn: sqlite3.Connection) -> None:
    """v1 -> v2: how each prompt was assembled under the token budget (PromptParts, JSON)."""
    conn.execute("ALTER TABLE llm_calls ADD COLUMN prompt_parts TEXT")


def _add_pending_calls(conn: sqlite3.Connection) -> None:
    """v2 -> v3: LLM calls counted before they are sent, until their reply is recorded;
    after a crash, those left count as spent (the provider may have billed them)."""
    conn.execute("CREATE TABLE pending_calls (id INTEGER PRIMARY KEY AUTOINCREMENT,"
                 " task TEXT NOT NULL, reserved_usd REAL NOT NULL, started_at TEXT NOT NULL)")


# _MIGRATIONS[v - 1] upgrades a store from schema version v to v + 1. A new store is built
# as version 1 and migrated like an old one, so there is a single path to the current
# schema. Append here; never edit a released migration.
_MIGRATIONS: list[Migration] = [_add_prompt_parts, _add_pending_calls]


def _current_version() -> int:
    return len(_MIGRATIONS) + 1


SCHEMA_VERSION = _current_version()


def _connect(uri: str) -> sqlite3.Connection:
    # isolation_level=None: autocommit, so a single statement is its own transaction and
    # multi-statement writes say BEGIN/COMMIT explicitly. check_same_thread=False because
    # LLM calls complete on worker threads; RunStore's lock serialises every use.
    conn = sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
    )
    conn.row_factory = sqlite3.Row
    return conn


def _configure(conn: sqlite3.Connection, path: Path) -> None:
    """Set the durability pragmas; only on a store we know is ours, since WAL mode sticks
    to the file."""
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            log.warning("run store %s: journal mode is %s, not WAL", path, mode)
        # FULL syncs the WAL on every commit: NORMAL may lose the last commits on power loss,
        # and we promise that a recorded event survives.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.DatabaseError as e:
        raise StoreError(f"cannot set up the run store {path}: {e}") from None


def _uri(path: Path, mode: str) -> str:
    return f"{path.resolve().as_uri()}?mode={mode}"


def _schema_version(conn: sqlite3.Connection, path: Path) -> int:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path} is not a pike run store ({e})") from None
    if row is None:
        raise StoreError(f"{path} is not a pike run store (no schema version)")
    try:
        return int(row[0])
    except ValueError:
        raise StoreError(f"{path} is not a pike run store (bad schema version {row[0]!r})") from None


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring an older store up to the current schema, one version per transaction."""
    version = _schema_version(conn, path)
    current = _current_version()
    if version > current:
        raise StoreError(
            f"{path} has schema version {version}, newer than this pike reads ({current}); "
            "upgrade pike to open it"
        )
    while version < current:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another connection (a thread of this run, a resumed run) may have migrated
            # since the version was read: read it again under the write lock.
            version = _schema_version(conn, path)
            if version >= current:
                conn.execute("COMMIT")
                break
            _MIGRATIONS[version - 1](conn)
            version += 1
            conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),)
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.info("run store %s migrated to schema version %d", path, version)
