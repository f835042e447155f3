"""The judge: evaluate(task, source, config) -> Verdict, and measure_baselines()."""

from pike.evaluate.baseline import BASELINE_MODES, Baseline, ModeTiming, measure_baselines
from pike.evaluate.judge import evaluate, resolve_device
from pike.evaluate.verdict import OutputMismatch, Status, TimingStats, Verdict

__all__ = [
    "BASELINE_MODES", "Baseline", "ModeTiming", "OutputMismatch", "Status", "TimingStats",
    "Verdict", "evaluate", "measure_baselines", "resolve_device",
]
