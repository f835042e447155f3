"""Typed user errors. The CLI prints their message on one line, without a traceback.

Candidate failures are never exceptions: they are Verdicts.
"""

from __future__ import annotations


class PikeError(Exception):
    """Base class for errors caused by the user's input or environment."""


class TaskError(PikeError):
    """A task file or folder is missing or malformed."""


class ConfigError(PikeError):
    """A configuration file or option is invalid."""


class EvaluatorError(PikeError):
    """The evaluator itself could not run (not the candidate's fault)."""


class LLMError(PikeError):
    """An LLM endpoint cannot be used as configured (for example, its API key is not set)."""


class StoreError(PikeError):
    """A run store is missing, not a pike run, from a newer pike, or used inconsistently."""
