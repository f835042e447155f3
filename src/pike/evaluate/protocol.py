"""What the parent and the child process say to each other.

The child starts before its request exists (importing torch takes seconds); the parent
then writes a ChildRequest as JSON and says "begin". The child answers with JSON lines on a pipe of
its own (not stdout, which candidate code may print to), and waits on a second pipe for
the parent's word before it starts timing.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from pydantic import BaseModel, Field

from pike.config import ConstructOn, TimingConfig

Role = Literal["reference", "candidate"]


# Input sets beyond the timing rotation, each used once, at a random timed call: a model
# that reuses answers for inputs it has seen is slow exactly on these (judge compares).
PROBE_SETS = 4


def timed_set_count(input_sets: int) -> int:
    """The input sets the reference draws for timing: the rotation's, then the probes."""
    return input_sets + PROBE_SETS


class ShiftSpec(BaseModel):
    """The trial with inputs of another distribution: drawn by the parent per reference
    run, so no candidate can special-case it. 'affine' maps x to x * scale + offset;
    'uniform' replaces x by uniform values in [offset - scale, offset + scale]."""

    kind: Literal["affine", "uniform"]
    scale: float
    offset: float
    seed: int


class ChildRequest(BaseModel):
    role: Role
    module_path: str = Field(description="the file to import (task or candidate)")
    class_names: list[str] = Field(description="first of these the module defines is used")
    inputs_dir: str = Field(description="reference writes the trial inputs here; candidate reads")
    outputs_dir: str = Field(description="where this child writes the outputs of each trial")
    device: str
    trials: int
    seed: int
    model_mode: Literal["as_constructed", "eval"]
    construct_on: ConstructOn = "cpu"
    timing: TimingConfig
    writable: list[str] = Field(default_factory=list,
                                description="the only folders candidate code may write to")
    guards: bool = True
    warm_up: bool = Field(False, description="candidate: one call before 'ready', where lazy "
                          "compilers (Triton, torch.compile) do their work")
    extensions_dir: str = Field("", description="candidate: where its compiled extensions "
                                "are built (the child sets TORCH_EXTENSIONS_DIR to it)")
    task_sha256: str = ""
    task_size: int = -1
    file_bytes_limit: int | None = Field(None, description="candidate: its RLIMIT_FSIZE, "
                                         "lowered before its code loads (disk_use.py)")
    input_sets: int = Field(2, description="timing rotates over this many input sets, "
                            "staged only when timing starts")
    # The reference's only: drawn by the parent, never written where a candidate reads.
    trial_seeds: list[int] = Field(default_factory=list)
    pool_seeds: list[int] = Field(default_factory=list)
    shift: ShiftSpec | None = None


class Channel:
    """Newline-delimited JSON over a pair of pipe file descriptors."""

    def __init__(self, write_fd: int, read_fd: int | None = None) -> None:
        self._write_fd = write_fd
        self._read_fd = read_fd
        self._pending = b""

    def send(self, event: str, **fields: Any) -> None:
        data = (json.dumps({"event": event, **fields}) + "\n").encode()
        while data:
            data = data[os.write(self._write_fd, data):]

    def receive(self) -> dict[str, Any] | None:
        """Blocking read of one message; None when the other side closed the pipe."""
        assert self._read_fd is not None
        while b"\n" not in self._pending:
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)


# How long a child waits for the processes it started to end before it exits; the parent
# waits longer than this for the child (driver.finish) before it looks for leftovers.
DESCENDANTS_GRACE_S = 8.0

# Beyond the configured trials: one with inputs of another distribution (a shifted mean and
# a larger scale, so shortcuts that assume randn inputs fail) and one run after timing,
# with new values written into the very tensors that were timed (so answers cached by
# pointer, shape or call count fail).
EXTRA_TRIALS = 2
