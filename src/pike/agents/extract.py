"""Reading LLM replies: the module that defines ModelNew, or a list of ideas."""

from __future__ import annotations

import ast
import re

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+(.*\S)")


def _defines_model(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "class ModelNew" in source  # let the evaluator report the syntax error
    return any(isinstance(node, ast.ClassDef) and node.name in ("ModelNew", "Model")
               for node in tree.body)


def extract_module(reply: str) -> str | None:
    """The last fenced block that defines ModelNew (or Model), else None.

    Models often show a snippet first and the full module last, so the last complete
    definition wins; a reply that is nothing but code is accepted as is.
    """
    blocks = [body for lang, body in _FENCE.findall(reply)
              if lang.lower() in ("", "python", "py", "python3")]
    for body in reversed(blocks):
        if _defines_model(body):
            return body.strip() + "\n"
    if not blocks and "class ModelNew" in reply and _defines_model(reply):
        return reply.strip() + "\n"
    return None


def extract_ideas(reply: str, limit: int) -> list[str]:
    """Numbered or bulleted items of a reply, continuation lines joined, at most `limit`."""
    ideas: list[str] = []
    for line in reply.splitlines():
        match = _LIST_ITEM.match(line)
        if match:
            ideas.append(match.group(1).strip())
        elif ideas and line.strip() and line.startswith((" ", "\t")):
            ideas[-1] += " " + line.strip()
    return [idea.replace("**", "") for idea in ideas if idea][:limit]
