"""Failure messages trimmed for a human and for an LLM: the useful part, a few KB at most."""

from __future__ import annotations

import errno
import re
import traceback

MAX_MESSAGE_CHARS = 4000
_BUILD_ERROR = re.compile(r"error|undefined|fatal", re.IGNORECASE)


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Keep the head and the tail of a long text; the middle is rarely what matters."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head - 40
    return f"{text[:head]}\n... [{len(text) - head - tail} characters cut] ...\n{text[-tail:]}"


def describe_exception(exc: BaseException, source_file: str | None = None) -> str:
    """The exception line plus the frames in `source_file` (the candidate), else the last few."""
    if is_build_failure(exc):
        return trim_build_log(str(exc))
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if source_file and f.filename == source_file]
    chosen = own[-6:] if own else frames[-3:]
    lines = [f'  File "{_short(f.filename)}", line {f.lineno}, in {f.name}\n    {f.line or ""}'
             for f in chosen]
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        head += ("\n  (a file reached the candidate's file-size limit, eval.limits.disk_gib: "
                 "its folders, printed output and each file are bounded)")
    body = "\n".join(lines)
    return clip(f"{head}\n{body}" if body else head)


def is_build_failure(exc: BaseException) -> bool:
    text = str(exc)
    return "Error building extension" in text or "ninja: build stopped" in text


def trim_build_log(log: str, context: int = 2) -> str:
    """Compiler errors with a little context; the full log is hundreds of lines of flags."""
    lines = log.splitlines()
    keep: set[int] = set()
    for i, line in enumerate(lines):
        if _BUILD_ERROR.search(line) and not line.lstrip().startswith(("[", "FAILED:")):
            keep.update(range(max(0, i - context), min(len(lines), i + context + 1)))
    if not keep:
        return clip(log)
    picked = [lines[i] for i in sorted(keep)]
    return clip("extension build failed:\n" + "\n".join(picked))


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1] if "/" in path else path
