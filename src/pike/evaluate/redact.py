"""Secrets never reach a verdict: what a candidate says is masked before anyone reads it.

A verdict's text (its message, the mismatch notes, the guards' notes) comes in part from
candidate code: exception messages, the child's output tail. A candidate that found a
credential could put it there, and from there it would reach the run store, the terminal
and the error fixer's prompt. So every value of pike's own environment that the child was
not given, and anything shaped like a credential, is replaced by a mask first.
"""

from __future__ import annotations

import os
import re

from pike.evaluate.child_environment import passed_to_child
from pike.evaluate.verdict import Verdict

MASK = "[masked]"
_MIN_LENGTH = 8  # shorter values ("1", "true", a user name) would mask ordinary words
_CREDENTIAL_SHAPES = [
    re.compile(p) for p in (
        r"sk-[A-Za-z0-9_\-]{16,}",  # OpenAI and compatible
        r"sk-ant-[A-Za-z0-9_\-]{16,}",
        r"gh[pousr]_[A-Za-z0-9]{20,}", r"github_pat_[A-Za-z0-9_]{20,}",
        r"glpat-[A-Za-z0-9_\-]{16,}",
        r"xox[abposr]-[A-Za-z0-9\-]{10,}",
        r"AKIA[0-9A-Z]{16}", r"ASIA[0-9A-Z]{16}",
        r"AIza[0-9A-Za-z_\-]{30,}",
        r"hf_[A-Za-z0-9]{20,}",
        r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",  # a JWT
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)",
    )
]
# user:password@ in a URL, and password=... / token: ... assignments
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.\-]*://[^/\s:@]+:)[^@\s/]+(?=@)")
_ASSIGNED = re.compile(r"(?i)(?P<head>\b[\w.\-]*(?:password|passwd|pwd|secret|token|api[_\-]?key)"
                       r"[\w.\-]*\s*[=:]\s*)(?P<value>[^\s,;'\"]{4,})")


def _environment_secrets() -> list[str]:
    values = {v for k, v in os.environ.items()
              if not passed_to_child(k) and len(v) >= _MIN_LENGTH}
    # Paths and path lists are not secrets, and masking them would hide useful tracebacks.
    return sorted((v for v in values if not v.startswith("/") and os.pathsep + "/" not in v),
                  key=len, reverse=True)


def mask_text(text: str) -> str:
    """`text` with every secret value of pike's environment and every credential-shaped
    string replaced by a mask."""
    if not text:
        return text
    for value in _environment_secrets():
        if value in text:
            text = text.replace(value, MASK)
    for shape in _CREDENTIAL_SHAPES:
        text = shape.sub(MASK, text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    return _ASSIGNED.sub(lambda m: m.group("head") + MASK, text)


def mask_secrets(verdict: Verdict) -> Verdict:
    """The verdict with its candidate-written text masked (in place, and returned)."""
    verdict.message = mask_text(verdict.message)
    verdict.guards = {k: mask_text(v) for k, v in verdict.guards.items()}
    for mismatch in verdict.mismatches:
        mismatch.problem = mask_text(mismatch.problem)
    verdict.flags_changed = {k: mask_text(v) for k, v in verdict.flags_changed.items()}
    return verdict
