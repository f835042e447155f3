"""A failed reference run: the task's error, or ReferenceOutOfMemory where memory, not the
task, ended it (which run_reference, and a resumed campaign, try again).
"""

from __future__ import annotations

from pike.errors import TaskError
from pike.evaluate.verdict import Verdict, says_out_of_memory
from pike.task import Task


class ReferenceOutOfMemory(TaskError):
    """The reference ran out of GPU memory, or was killed by a SIGKILL pike did not send
    (run_reference runs it once more)."""


def _killed_from_outside(failure: Verdict) -> bool:
    """The task's own module (trusted) ended by a SIGKILL that pike did not send (its
    limits' kills read otherwise): on the level1 bench on an H200 that was the host's
    out-of-memory killer each time, named so or not (the host's kill count had not moved
    since the child was last seen alive), and the task failed for its neighbours'
    memory."""
    return failure.status == "crashed" and (failure.message or "").startswith(_KILLED)


_KILLED = "killed by signal SIGKILL"


def failed_for_memory(error: str) -> bool:
    """Whether a task's stored error is its reference ended by memory (ReferenceOutOfMemory's
    message), not by the task: a resumed campaign tries such a task again."""
    return "reference failed" in error and (_KILLED in error or says_out_of_memory(error))


def reference_failed(task: Task, failure: Verdict | None, device: str = "") -> TaskError:
    """The task's error; ReferenceOutOfMemory where memory, not the task, ended it (the
    GPU's, said so on `device`, or a SIGKILL from outside), which a campaign tries again
    once the other tasks' children are gone."""
    message = failure.message.strip() if failure and failure.message else "no message"
    phase = failure.phase if failure else "?"
    text = f"{task.path}: reference failed in phase '{phase}': {message.splitlines()[0]}"
    if failure is not None and (device.startswith("cuda") and says_out_of_memory(message)
                                or _killed_from_outside(failure)):
        return ReferenceOutOfMemory(text)
    return TaskError(text)
