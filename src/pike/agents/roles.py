"""The messages each role sends: brainstormer (IBA), optimizer, error fixer (EFA)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import jinja2

from pike.evaluate.verdict import Verdict

Messages = list[dict[str, str]]
_REPORT_LIMIT = 4000


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pike.agents", "templates"),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        autoescape=False,  # prompts are plain text, not HTML  # noqa: S701
    )


@dataclass(frozen=True)
class AgentContext:
    """What every prompt of one task shares."""

    task_source: str
    backend: str  # any | cuda | triton
    device: str  # e.g. "NVIDIA H100 80GB HBM3 (compute capability 9.0, 79 GiB)"
    atol: float = 1e-2
    reference_profile: str = ""  # where the reference's time goes (EvalConfig.profile)
    profile_tokens: int = 300

    def _messages(self, template: str, **values: object) -> Messages:
        env = _templates()
        system = env.get_template("system.j2").render(device=self.device, backend=self.backend,
                                                       atol=self.atol)
        user = env.get_template(template).render(task_source=self.task_source, **values)
        return [{"role": "system", "content": system.strip()},
                {"role": "user", "content": user.strip()}]


def brainstorm_messages(ctx: AgentContext, count: int) -> Messages:
    return ctx._messages("brainstorm.j2", count=count)


def optimize_messages(ctx: AgentContext, parent_source: str | None,
                      parent_verdict: Verdict | None, idea: str | None) -> Messages:
    runtime = speedup = ""
    if parent_verdict is not None and parent_verdict.runtime is not None:
        runtime = f"{parent_verdict.runtime.median_ms:.4g} ms"
        speedup = f"{parent_verdict.speedup:.2f}x" if parent_verdict.speedup else "?x"
    profile = ctx.reference_profile if parent_source is None else ""
    if parent_verdict is not None and parent_verdict.profile is not None:
        from pike.evaluate.profile import render

        profile = render(parent_verdict.profile, ctx.profile_tokens)
    return ctx._messages("optimize.j2", parent_source=parent_source, idea=idea,
                         parent_runtime=runtime, parent_speedup=speedup, profile=profile)


def fix_messages(ctx: AgentContext, failing_source: str, verdict: Verdict) -> Messages:
    report = verdict.message or "(no message)"
    if verdict.mismatches:
        m = verdict.mismatches[0]
        report += (f"\nfirst mismatch: trial {m.trial}, output {m.output}: {m.problem}"
                   f" (expected shape {m.expected_shape}, got {m.actual_shape})")
    return ctx._messages("fix.j2", failing_source=failing_source, status=verdict.status,
                         report=report[-_REPORT_LIMIT:])


@dataclass(frozen=True)
class ProgramView:
    """A program as an evolution prompt shows it."""

    source: str
    speedup: str = "?x"
    status: str = "ok"
    message: str = ""


def evolve_messages(ctx: AgentContext, parent: ProgramView | None, other: ProgramView | None,
                    top: list[ProgramView], failed: ProgramView | None,
                    step: str | None = None) -> Messages:
    """Mutation (one parent, or the reference) or crossover (two parents) for PIKE-O; with
    the planner on, `step` is the plan's step this query implements."""
    template = "evolve_crossover.j2" if parent and other else "evolve_mutation.j2"
    return ctx._messages(template, parent=parent, other=other, top=top, failed=failed,
                         step=step)


def planner_messages(ctx: AgentContext, best_source: str | None, best: Verdict | None,
                     count: int) -> Messages:
    """The planner: a ranked list of concrete steps from the current best and its profile."""
    runtime = speedup = times_floor = profile = ""
    if best is not None and best.runtime is not None:
        runtime = f"{best.runtime.median_ms:.4g} ms"
        speedup = f"{best.speedup:.2f}x" if best.speedup else "?x"
        times_floor = f"{best.times_floor:.3g}x" if best.times_floor else ""
    if best is not None and best.profile is not None:
        from pike.evaluate.profile import render

        profile = render(best.profile, ctx.profile_tokens)
    elif best_source is None:
        profile = ctx.reference_profile
    backend_words = {"cuda": "CUDA C++", "triton": "Triton"}.get(ctx.backend,
                                                                 "CUDA C++ or Triton")
    return ctx._messages("planner.j2", best_source=best_source, best_runtime=runtime,
                         best_speedup=speedup, times_floor=times_floor, profile=profile,
                         count=count, backend_words=backend_words)


def plan_ideas(steps: list[str], branches: int, granularity: str) -> list[str]:
    """What each query of a round implements: one step, a few, or the whole plan."""
    if not steps:
        return []
    if granularity == "free":
        plan = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(steps))
        return [f"implement as much of this plan as pays:\n{plan}"] * branches
    width = 3 if granularity == "several" else 1
    return ["; then ".join(steps[(b + k) % len(steps)] for k in range(min(width, len(steps))))
            for b in range(branches)]


def describe_device(device: str) -> str:
    """The GPU (or CPU) the evaluator runs on, as the prompt states it."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        return (f"{props.name} (compute capability {props.major}.{props.minor}, "
                f"{props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, "
                f"torch {torch.__version__}")
    return f"CPU only (no GPU), torch {torch.__version__}"
