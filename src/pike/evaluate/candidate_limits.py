"""A candidate's time limits: fitted to its reference's own check phase, and longer for a
warm-up call its source builds in (torch.compile, Triton).
"""

from __future__ import annotations

import re

from pike.config import EvalConfig

# A candidate may take this many times the reference's own check phase to check or to
# time a block before it is judged `timeout`, but never less than the floor: a hung
# candidate on a small task gets its verdict within a minute, a large task keeps room.
_LIMIT_TIMES_REFERENCE, _LIMIT_FLOOR_S = 50.0, 30.0


def fitted_limit(reference_check_s: float) -> float:
    """The check and timing limits of a candidate (the config's limits stay ceilings)."""
    return max(_LIMIT_FLOOR_S, _LIMIT_TIMES_REFERENCE * reference_check_s)


# Candidates that build in their first call: torch.compile (its graphs, max-autotune's
# autotuning, CUDA-graph capture) and Triton kernels (JIT-compiled, autotuned at first
# launch). Beside other evaluations on an H200, max-autotune candidates whose reference
# checks in under a second were judged `timeout` at the fitted 30 s in their first call.
# Not load_inline: it builds at import, under the load phase's limit, and a CUDA
# candidate whose kernel hangs keeps getting its verdict in 30 s.
_BUILDS_IN_FIRST_CALL = re.compile(
    r"\btorch\.compile\b|\btorch\._dynamo\b|@triton\."
    r"|^\s*(?:import|from)\s+[\w., ]*\btriton\b|^\s*from\s+torch\s+import\s+[\w, ]*\bcompile\b",
    re.MULTILINE)


def first_call_limit(source: str, cfg: EvalConfig) -> float | None:
    """The limit of a candidate's warm-up call where its source builds there (a torch.compile
    mode's build, as its baseline has, `limits.build_seconds`); None: the fitted check limit.
    A hung candidate that names them only waits longer for its verdict: init alone has more."""
    return cfg.limits.build_seconds if _BUILDS_IN_FIRST_CALL.search(source) else None
