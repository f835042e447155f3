"""The messages each role sends: brainstormer (IBA), optimizer, error fixer (EFA),
evolution (mutation, crossover) and planner. Each prompt is assembled from parts under
the token budget (agents/prompt.py) and carries the record of that assembly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import jinja2

from pike.agents.prompt import Assembly, Part, Prompt, fit
from pike.config import LLMConfig
from pike.evaluate.verdict import Verdict

Messages = list[dict[str, str]]
_REPORT_LIMIT = 4000

# What a prompt keeps first when the budget is short (the system message and the task are
# always kept): the program to improve, the plan step, the profile, the top programs, then
# recent errors.
PARENT, STEP, PROFILE, TOP, ERRORS = 50, 40, 30, 20, 10


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
    prompt_tokens: int | None = LLMConfig.model_fields["prompt_tokens"].default

    def _prompt(self, template: str | Callable[[Assembly], str], parts: list[Part],
                values: Callable[[Assembly], dict[str, object]]) -> Prompt:
        """The system and user messages, with `parts` (their empty ones left out) kept or
        cut to the budget; `values` gives the template what was kept."""
        env = _templates()
        system = env.get_template("system.j2").render(device=self.device, backend=self.backend,
                                                       atol=self.atol).strip()
        required = [Part("system", system, 0, "never"), Part("task", self.task_source, 0, "never")]

        def render(kept: Assembly) -> Messages:
            name = template if isinstance(template, str) else template(kept)
            user = env.get_template(name).render(task_source=self.task_source, **values(kept))
            return [{"role": "system", "content": system},
                    {"role": "user", "content": user.strip()}]

        return fit(required + [p for p in parts if p.text], self.prompt_tokens, render)


def brainstorm_messages(ctx: AgentContext, count: int) -> Prompt:
    return ctx._prompt("brainstorm.j2", [], lambda kept: {"count": count})


def optimize_messages(ctx: AgentContext, parent_source: str | None,
                      parent_verdict: Verdict | None, idea: str | None) -> Prompt:
    runtime = speedup = ""
    if parent_verdict is not None and parent_verdict.runtime is not None:
        runtime = f"{parent_verdict.runtime.median_ms:.4g} ms"
        speedup = f"{parent_verdict.speedup:.2f}x" if parent_verdict.speedup else "?x"
    profile = ctx.reference_profile if parent_source is None else ""
    if parent_verdict is not None and parent_verdict.profile is not None:
        from pike.evaluate.profile import render

        profile = render(parent_verdict.profile, ctx.profile_tokens)
    parts = [Part("parent", parent_source or "", PARENT), Part("step", idea or "", STEP, "head"),
             Part("profile", profile, PROFILE, "head",
                  needs="parent" if parent_source else None)]
    return ctx._prompt("optimize.j2", parts, lambda kept: {
        "parent_source": kept.text("parent"), "idea": kept.text("step"),
        "parent_runtime": runtime, "parent_speedup": speedup, "profile": kept.text("profile")})


def fix_messages(ctx: AgentContext, failing_source: str, verdict: Verdict) -> Prompt:
    report = verdict.message or "(no message)"
    if verdict.mismatches:
        m = verdict.mismatches[0]
        report += (f"\nfirst mismatch: trial {m.trial}, output {m.output}: {m.problem}"
                   f" (expected shape {m.expected_shape}, got {m.actual_shape})")
    # The failing source is required: a fixer that cannot see the program cannot fix it.
    parts = [Part("parent", failing_source, PARENT, "never"),
             Part("errors", report[-_REPORT_LIMIT:], ERRORS, "tail")]
    return ctx._prompt("fix.j2", parts, lambda kept: {
        "failing_source": failing_source, "status": verdict.status,
        "report": kept.text("errors") or "(too long for the prompt)"})


@dataclass(frozen=True)
class ProgramView:
    """A program as an evolution prompt shows it."""

    source: str
    speedup: str = "?x"
    status: str = "ok"
    message: str = ""


def evolve_messages(ctx: AgentContext, parent: ProgramView | None, other: ProgramView | None,
                    top: list[ProgramView], failed: ProgramView | None,
                    step: str | None = None) -> Prompt:
    """Mutation (one parent, or the reference) or crossover (two parents) for PIKE-O; with
    the planner on, `step` is the plan's step this query implements. A parent dropped for
    the budget turns a crossover into a mutation of the one kept."""
    parts = [Part("parent", parent.source if parent else "", PARENT),
             Part("other", other.source if other else "", PARENT),
             Part("step", step or "", STEP, "head"),
             *(Part(f"top:{i}", p.source, TOP) for i, p in enumerate(top, 1)),
             Part("errors", failed.source if failed else "", ERRORS)]

    def parents(kept: Assembly) -> list[ProgramView]:
        return [view for view, name in ((parent, "parent"), (other, "other"))
                if view is not None and kept.text(name)]

    def values(kept: Assembly) -> dict[str, object]:
        kept_parents = parents(kept)
        return {"parent": kept_parents[0] if kept_parents else None,
                "other": kept_parents[1] if len(kept_parents) == 2 else None,
                "top": [p for i, p in enumerate(top, 1) if kept.text(f"top:{i}")],
                "failed": failed if kept.text("errors") else None,
                "step": kept.text("step") or None}

    return ctx._prompt(
        lambda kept: "evolve_crossover.j2" if len(parents(kept)) == 2 else "evolve_mutation.j2",
        parts, values)


def planner_messages(ctx: AgentContext, best_source: str | None, best: Verdict | None,
                     count: int) -> Prompt:
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
    parts = [Part("parent", best_source or "", PARENT),
             Part("profile", profile, PROFILE, "head", needs="parent" if best_source else None)]
    return ctx._prompt("planner.j2", parts, lambda kept: {
        "best_source": kept.text("parent"), "best_runtime": runtime, "best_speedup": speedup,
        "times_floor": times_floor, "profile": kept.text("profile"), "count": count,
        "backend_words": backend_words})


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
