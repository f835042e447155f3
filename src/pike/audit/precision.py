"""Which lower precisions a solution uses, as far as its source and the evaluator's record
of changed backend flags show.

This is a hint for the reader, not a verdict: the evaluator already requires every output
to match the task's dtype within tolerance on every trial. A marker is reported only when
the solution uses it and the task's own reference does not (the task's dtype is the
contract). Markers are searched in the code and its strings (embedded CUDA and Triton
source count), not in comments:

  fp8       float8 dtypes, __nv_fp8
  fp16      .half(), float16, torch.half, __half, tl.float16
  bf16      bfloat16, __nv_bfloat16
  autocast  torch.autocast / torch.cuda.amp / torch.amp autocast
  tf32      allow_tf32, set_float32_matmul_precision('high' | 'medium'), or a TF32 flag the
            evaluator saw the candidate turn on (Verdict.flags_changed)
"""

from __future__ import annotations

import io
import re
import tokenize

from pike.evaluate.verdict import Verdict

# lowest precision first: the order the result lists them in
_MARKERS: dict[str, re.Pattern[str]] = {
    "fp8": re.compile(r"float8|__nv_fp8|\bfp8\b"),
    "fp16": re.compile(r"\.half\(|float16|torch\.half\b|__half\b|\bhalf2\b"),
    "bf16": re.compile(r"bfloat16|__nv_bfloat16"),
    "autocast": re.compile(r"autocast"),
    "tf32": re.compile(r"allow_tf32|set_float32_matmul_precision\(\s*['\"](high|medium)"
                       r"|fp32_precision\s*=\s*['\"]tf32"),
}


def detect_precision(source: str, reference: str = "",
                     verdict: Verdict | None = None) -> list[str]:
    """The lower-precision markers of `source` that `reference` lacks, lowest first."""
    code, ref_code = _without_comments(source), _without_comments(reference)
    found = {name for name, pattern in _MARKERS.items()
             if pattern.search(code) and not pattern.search(ref_code)}
    if verdict is not None:
        found |= _from_flags(verdict.flags_changed)
    return [name for name in _MARKERS if name in found]


def _from_flags(flags: dict[str, str]) -> set[str]:
    """Flags are recorded as `before -> after`."""
    found = set()
    for key, change in flags.items():
        after = change.rpartition("->")[2].strip()
        if "allow_tf32" in key and after == "True":
            found.add("tf32")
        elif key == "float32_matmul_precision" and after in ("high", "medium"):
            found.add("tf32")
        elif key.endswith("fp32_precision") and after == "tf32":  # torch's newer API
            found.add("tf32")
        elif "fp16_reduced_precision" in key and after == "True":
            found.add("fp16")
        elif key == "default_dtype":
            found |= {name for name, p in _MARKERS.items() if p.search(after)}
    return found


def _without_comments(source: str) -> str:
    """The source with its comments cut off (a comment runs to the end of its line)."""
    lines = source.splitlines(keepends=True)
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col] + "\n"
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source  # not valid Python: search all of it
    return "".join(lines)
