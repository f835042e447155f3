"""Pike and the kernel's out-of-memory killer: its children are chosen before it, and a
child's SIGKILL is told to be the killer's by the host's count of its kills.
"""

from __future__ import annotations

# How much likelier than pike each child is to be chosen by the kernel's out-of-memory
# killer (/proc/PID/oom_score_adj, -1000 to 1000; raising it needs no privilege). On a
# lent two-GPU H200 host a level1 `pike bench` was killed twice by a SIGKILL nothing in
# pike sends, minutes in, beside another bench: with pike gone, every evaluation in
# flight is lost at once. A child taken instead loses one evaluation, and says why
# (ChildExit.host_out_of_memory); the untrusted candidate goes before a reference.
# Never below pike's own score (a service manager may have raised it): see child_oom_score.
OOM_SCORE_ADJ = {"candidate": 1000, "reference": 500}


def _own_oom_score() -> int:
    try:
        with open("/proc/self/oom_score_adj", "rb") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def child_oom_score(role: str) -> int:
    """The out-of-memory score a child of `role` starts with: its OOM_SCORE_ADJ, or pike's
    own where that is higher (a child below pike would be taken after it)."""
    return max(_own_oom_score(), OOM_SCORE_ADJ.get(role, 0))


def host_oom_kills(vmstat: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's out-of-memory killer has ended on this host since
    it started (/proc/vmstat's oom_kill, Linux 4.13 on); None where it is not kept."""
    try:
        with open(vmstat, "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None
