"""How long a child's main thread waited for a core while it was runnable, from the
kernel's scheduler statistics (/proc/PID/schedstat: run time, run-queue wait, slices).

On a CPU a timed call that waits for a core is timed with the wait in it. On the 2-core
host with two busy processes beside it, an honest candidate's speedup came out anywhere
from 0.002x to 163x (bench/results/probe-cost-centred-load2-slow-probes.md): the
reference waited through whole blocks while the candidate ran, or the other way about.
The kernel's count is beyond either child's reach; the timing windows read it around
each kept block of a CPU window (timing_window), and a verdict whose children waited for
much of their blocks says so (candidate_windows.waited_for_cores, Verdict.host_busy)."""

from __future__ import annotations


def waited_s(pid: int | None) -> float | None:
    """Seconds `pid`'s main thread has spent runnable but not running, or None where the
    kernel does not say (not Linux, no schedstats, the process gone)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
