"""The run store's values as its rows hold them: a candidate read back (CandidateRow),
times as ISO 8601 UTC text, and JSON that refuses what it cannot encode.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone

from pydantic import BaseModel

from pike.errors import StoreError
from pike.evaluate.verdict import Verdict


class CandidateRow(BaseModel):
    """One candidate as recorded: its source, where it came from, and its verdict once judged."""

    id: int
    task: str
    source: str
    parent_id: int | None
    role: str  # 'reference' | 'optimize' | 'fix' | 'offline' | ...
    round: int
    branch: int
    idea: str = ""
    llm_call_id: int | None = None
    created_at: str  # ISO 8601, UTC
    verdict: Verdict | None = None  # None until evaluated
    evaluated_at: str | None = None  # ISO 8601, UTC; when its verdict was recorded


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _timestamp(value: object) -> str | None:
    """An LLM call's start time as ISO UTC text, whichever way the caller kept it."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, timezone.utc).isoformat()
    return str(value)


def _to_json(value: object, what: str) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as e:
        raise StoreError(f"{what} is not JSON-serialisable: {e}") from None


def _candidate_row(row: sqlite3.Row) -> CandidateRow:
    fields = dict(row)
    verdict = fields.pop("verdict")
    return CandidateRow(
        **fields, verdict=None if verdict is None else Verdict.model_validate_json(verdict)
    )
