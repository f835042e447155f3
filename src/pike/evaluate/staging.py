"""Inputs within a candidate's reach only when the phase that uses them has started.

The reference's child writes every input set into one folder; each candidate gets a
folder of its own, empty but for the init inputs, and the parent links a phase's files
into it when the child asks for them and the parent has started that phase (trials after
"go", the timed sets when timing starts, the after-timing set with the final check). A
constructor that reads ahead finds nothing; a request out of turn is refused.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class InputStage:
    source: Path  # the reference's inputs (read-only)
    folder: Path  # the candidate's view of its inputs
    phases: dict[str, list[str]]  # phase -> the file names it uses
    permitted: set[str] = field(default_factory=set)
    staged: set[str] = field(default_factory=set)
    withdrawn: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.folder.mkdir(exist_ok=True)
        self._link("init_inputs.pt")

    def put(self, phase: str) -> str | None:
        """Stage `phase`'s files; why not, when the child asked out of turn."""
        if phase not in self.phases:
            return f"asked for inputs of an unknown phase {phase[:40]!r}"
        if phase in self.withdrawn:
            return (f"asked for the {phase} inputs again after they were loaded and taken "
                    "out of its folder")
        if phase not in self.permitted:
            return (f"asked for the {phase} inputs before the evaluator started that phase "
                    "(reading inputs ahead is not allowed)")
        for name in self.phases[phase]:
            self._link(name)
        self.staged.add(phase)
        return None

    def withdraw(self, phase: str) -> None:
        """Take `phase`'s files out of the child's folder (loaded, they are no longer
        needed there); a later request for the phase is refused, not staged again."""
        self.withdrawn.add(phase)
        for name in self.phases.get(phase, []):
            (self.folder / name).unlink(missing_ok=True)

    def _link(self, name: str) -> None:
        target = self.folder / name
        if target.exists():
            return
        try:
            os.link(self.source / name, target)  # no copy: same read-only file
        except OSError:
            shutil.copyfile(self.source / name, target)
            target.chmod(0o444)
