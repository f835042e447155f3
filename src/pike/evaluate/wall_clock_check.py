"""Whether a child's reported times account for the wall time the parent measured around
its timing blocks, against the timing loop's own cost (calibrated in the reference child)
and the reference's blocks timed in the same window.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass

from pike.evaluate.sandbox import ChildProcess
from pike.evaluate.timing_window import Timer, _time_one_block

log = logging.getLogger(__name__)


@dataclass
class LoopCost:
    """What the timing loop costs outside the timed region: per block and per call."""

    per_block_s: float
    per_call_s: float


def calibrate(trusted: ChildProcess) -> LoopCost:
    """Time an empty call in blocks of two sizes in the (trusted) reference child; the
    difference separates the per-call cost (flush, events, sync) from the per-block cost
    (the request over the pipes, the untimed first call)."""
    walls = {}
    for calls in (0, 10, 200):  # the first only warms the loop up
        timer = Timer(trusted, "empty", warmed=calls > 0)
        started = time.perf_counter()
        _time_one_block(timer, min_calls=max(calls, 1), min_seconds=0.0,
                        max_calls=max(calls, 1))
        # measured as the blocks it is subtracted from are (to their answer's arrival)
        walls[calls] = timer.blocks[-1][0] if timer.blocks else time.perf_counter() - started
        if timer.stopped:
            return LoopCost(0.0, 0.0)
    per_call = max(0.0, (walls[200] - walls[10]) / 190)
    return LoopCost(max(0.0, walls[10] - 10 * per_call), per_call)


_SLACK_S = 0.005  # scheduling noise of one block on a busy host


# A block is suspicious when the wall time its calls cannot account for exceeds this many
# times what it reported; a window whose blocks are mostly suspicious is forged unless its
# median stretch is within CONTROL_FACTOR of the reference's (a loaded host stretches
# both). Measured by bench/wall_margin.py: honest blocks stretch at most 1.32 on a CPU
# host and 1.10 on an H200, the reference's at most 1.13 (wall-margin-cpu.md,
# wall-margin-h200.md); 3 let a candidate report a third of its time.
WALL_MARGIN = 2.0
CONTROL_FACTOR = 2.0
# Below the margin, a figure is still held to the parent's clock: a candidate whose median
# stretch is more than this times the reference's gets the time its blocks support. Honest
# medians sit at 0.94 to 1.04 beside references at 0.84 to 0.88 (same tables), so honest
# figures are untouched and an under-reporting candidate gains at most this much.
FIGURE_TOLERANCE = 1.2
# The bound on the median sample (what the figure is) is looser: how far the clock's time
# per call sits above the median depends on the spread of each one's calls, and under load
# the candidate's and the reference's spreads differ. With two busy loops on the 2-core CPU
# host an honest candidate came out at up to 2.0 times the reference's ratio (raised 1.68x
# at a tolerance of 1.2); a forger's is its true time over a microsecond.
MEDIAN_TOLERANCE = 3.0


def block_stretches(cost: LoopCost, timer: Timer) -> list[float]:
    """Each block's wall time left after the loop's cost and a slack, over what the child
    reported for it (its samples and the untimed first call)."""
    stretches = []
    for wall, samples in timer.blocks:
        reported = _reported_s(samples)
        unexplained = _calls_wall_s(cost, wall, samples)
        stretches.append(unexplained / reported if reported > 0 else math.inf)
    return stretches


def _reported_s(samples: list[float]) -> float:
    """What a block's samples (ms) say its calls took, the untimed first call counted as
    one of their mean, in seconds."""
    return (sum(samples) + statistics.fmean(samples)) / 1e3


def _calls_wall_s(cost: LoopCost, wall: float, samples: list[float]) -> float:
    """What the parent's clock leaves of a block for its calls (the untimed first one
    too): its wall time less the loop's cost and the scheduling slack."""
    return wall - cost.per_block_s - (len(samples) + 1) * cost.per_call_s - _SLACK_S


def _stretch(cost: LoopCost, timer: Timer) -> tuple[int, float]:
    """(blocks whose stretch exceeds WALL_MARGIN, median stretch)."""
    stretches = block_stretches(cost, timer)
    suspicious = sum(s > WALL_MARGIN for s in stretches)
    return suspicious, statistics.median(stretches) if stretches else 0.0


def wall_clock_factor(cost: LoopCost, judged: Timer, reference: Timer) -> float:
    """By how much the judged child's reported times must grow for its blocks to stretch no
    more than FIGURE_TOLERANCE times the reference's (at least 1): 1.0 for honest timings.

    Held two ways, since the figure is the median sample, not the blocks' sums: the blocks'
    sums against their wall times, and the median sample against the per-call time the
    clock supports. A candidate that rewrites earlier samples of a block and leaves its
    last one true keeps each block's sum near the truth while most samples, and so the
    median, are forged: on a loaded CPU host blocks of two and three calls let one through
    at 629,229x before the second bound."""
    if not judged.blocks or not reference.blocks:
        return 1.0
    _, ratio = _stretch(cost, judged)
    _, ref_ratio = _stretch(cost, reference)
    if not math.isfinite(ratio):  # blocks that reported nothing: the margin's to judge
        return 1.0
    by_sums = ratio / (FIGURE_TOLERANCE * _allowance(ref_ratio))
    # The same for the median: the clock's time per call over the median sample, against
    # the reference's (a loaded host's long tail lifts the mean above the median for both).
    # A median of 0 gives no ratio: no factor raises it (such samples are refused where
    # they arrive, in _time_one_block), and a reference's allows nothing beyond 1.
    judged_over, reference_over = (_clock_over_median(cost, judged),
                                   _clock_over_median(cost, reference))
    by_median = (0.0 if judged_over is None
                 else judged_over / (MEDIAN_TOLERANCE * _allowance(reference_over)))
    factor = max(by_sums, by_median)
    return factor if factor > 1.0 + 1e-9 else 1.0  # at the bound exactly: honest


def _allowance(reference_ratio: float | None) -> float:
    """The reference's ratio as the judged one's allowance: at least 1, and 1 where the
    reference's cannot be taken (no median, blocks that reported nothing)."""
    if reference_ratio is None or not math.isfinite(reference_ratio):
        return 1.0
    return max(reference_ratio, 1.0)


def _clock_over_median(cost: LoopCost, timer: Timer) -> float | None:
    """The median over blocks of the time per call the parent's clock leaves for the calls
    (the untimed first one too, after the loop's cost and the slack), over the median of
    the reported samples: about 1 for honest calls of little spread; None where that
    median is not a positive time."""
    median_ms = statistics.median(x for _, samples in timer.blocks for x in samples)
    clock_ms = statistics.median(max(0.0, _calls_wall_s(cost, wall, samples))
                                 / (len(samples) + 1) * 1e3 for wall, samples in timer.blocks)
    return clock_ms / median_ms if median_ms > 0 else None


def unaccounted_wall_time(cost: LoopCost, judged: Timer, reference: Timer,
                          strict: bool = False) -> str | None:
    """Why the judged child's timings cannot be true, or None when they account for the
    wall time the parent measured around each of its blocks.

    Everything in the child can be reached by the candidate's code (frames, memory), so
    its reported samples are checked against a clock the candidate cannot touch. The
    trusted reference, timed in the same window, tells an overloaded host (its blocks
    stretch too) from forged timings: the candidate's blocks must stretch far more than
    the reference's, not merely as much, before it counts as forged.
    """
    suspicious, ratio = _stretch(cost, judged)
    if not judged.blocks or suspicious <= len(judged.blocks) // 2:
        return None
    _, ref_ratio = _stretch(cost, reference)
    # `strict`: the second look after a window that was clearly forged; a load that now
    # stretches the reference too must not clear it (a forger would wait for one).
    if not strict and (ratio <= CONTROL_FACTOR * max(ref_ratio, 1.0)
                       or _within_the_reference_s_load(cost, judged, reference)):
        log.warning("wall-clock check inconclusive: the host is loaded (the reference's "
                    "timing blocks stretched too)")
        return None
    return (f"reported timings that do not account for the wall time of its timing "
            f"blocks ({suspicious} of {len(judged.blocks)} blocks took over "
            f"{WALL_MARGIN:g}x longer than the calls it reported; median stretch "
            f"{ratio:.2f} against the reference's {ref_ratio:.2f})")


def _within_the_reference_s_load(cost: LoopCost, judged: Timer, reference: Timer) -> bool:
    """Whether most of the judged child's blocks stay within the margin once CONTROL_FACTOR
    times the wall time the reference's blocks took beyond their calls (the host's load
    per block, in seconds) is taken off theirs. The ratios alone miss that load where the
    calls take microseconds: the slack taken off every block is most of it, so the
    reference's stretch reads negative (-1.77 on the 2-core CI host) while its blocks took
    nearly as long as the candidate's, which a few hundred microseconds more put over."""
    if not reference.blocks:
        return False
    load = statistics.median(max(0.0, _calls_wall_s(cost, wall, samples) + _SLACK_S
                                 - _reported_s(samples))
                             for wall, samples in reference.blocks)
    over = 0
    for wall, samples in judged.blocks:
        reported = _reported_s(samples)
        left = _calls_wall_s(cost, wall, samples) - CONTROL_FACTOR * load
        over += left > WALL_MARGIN * reported
    return over <= len(judged.blocks) // 2
