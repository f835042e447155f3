"""The agents: what each role is asked (Jinja2 templates) and how its reply is read.

Agents do not call the LLM themselves; the search does, so that every call goes through
one budget ledger and one store.
"""

from pike.agents.extract import extract_ideas, extract_module
from pike.agents.roles import (
    AgentContext,
    ProgramView,
    brainstorm_messages,
    evolve_messages,
    fix_messages,
    optimize_messages,
    plan_ideas,
    planner_messages,
)

__all__ = ["AgentContext", "ProgramView", "brainstorm_messages", "evolve_messages",
           "extract_ideas", "extract_module", "fix_messages", "optimize_messages",
           "plan_ideas", "planner_messages"]
