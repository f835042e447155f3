"""pike: make PyTorch inference faster, with every candidate judged by a strict evaluator."""

from pike.config import EvalConfig, RunConfig
from pike.errors import ConfigError, EvaluatorError, PikeError, TaskError
from pike.evaluate import Baseline, Verdict, evaluate, measure_baselines
from pike.task import Task, load_task, load_tasks

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # optimize pulls in the LLM stack (openai); `import pike` for evaluation stays light
    if name == "optimize":
        from pike.search import optimize

        return optimize
    raise AttributeError(f"module 'pike' has no attribute {name!r}")

__all__ = [
    "Baseline", "ConfigError", "EvalConfig", "EvaluatorError", "PikeError", "RunConfig", "Task",
    "TaskError", "Verdict", "evaluate", "load_task", "load_tasks", "measure_baselines",
    "optimize",
]
