"""How a child's wait can end other than with a message: it exited, overran a phase's
time, its memory or its process count (sandbox.ChildProcess.receive); driver.abnormal_end
turns each into its verdict.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pike.evaluate.disk_use import DiskExceeded


@dataclass
class ChildExit:
    """The child ended (or its pipe closed) without saying more."""

    returncode: int | None
    output_tail: str
    # killed by SIGKILL, which pike did not send, while the kernel's out-of-memory killer
    # ended some process of the host: the host ran out of memory, most likely this way
    host_out_of_memory: bool = False
    last_rss_bytes: int | None = None  # the child tree's memory when pike last measured it


@dataclass
class PhaseTimeout:
    phase: str
    limit_s: float


@dataclass
class MemoryExceeded:
    used_bytes: int
    limit_bytes: int


@dataclass
class TooManyProcesses:
    count: int
    limit: int
    role: str  # whose code started them: a candidate's, or the task's own (the reference)


# The most processes a child's tree may hold (bwrap's two included) before it is ended. A
# candidate's own work needs a few dozen at most: torch.compile's pool of compile workers,
# ninja and nvcc's stages for load_inline, Triton's ptxas; a baseline's compile workers
# are one per build core, each with a compiler of its own at times. A fork bomb ran on
# until its phase limit (30 s or more), every core and the host's process table its own;
# found within a walk of the tree (sandbox: about once a second), it ends there. The
# tree is all it started: an orphan (a double fork) goes to bwrap's init in the OS
# sandbox, or to the child itself without it (child_start: a subreaper).
MAX_PROCESSES = max(512, 4 * (os.cpu_count() or 1))


def process_limit(env: dict[str, str]) -> int:
    """A child's limit: MAX_PROCESSES, or more where its compile workers need it (a
    sidecar and `TORCHINDUCTOR_COMPILE_THREADS` workers, each with a compiler's few)."""
    try:
        workers = int(env.get("TORCHINDUCTOR_COMPILE_THREADS", "1"))
    except ValueError:
        workers = 1
    return MAX_PROCESSES + 4 * max(0, workers - 1)


Event = (dict[str, Any] | ChildExit | PhaseTimeout | MemoryExceeded | TooManyProcesses
         | DiskExceeded)
