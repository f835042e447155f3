"""Prompt assembly under a token budget.

Every agent's prompt is built from named parts (the task, the parent, the plan step, the
profile, the top programs, recent errors). When they do not all fit the budget, the
higher-priority parts are kept whole and the lower ones are trimmed at line boundaries or
dropped; a required part (the task source, the system message) is never cut. What each
part cost, and what was trimmed or dropped, is recorded with the LLM call.

Tokens are estimated, not counted with a provider's tokenizer: prompts go to many model
families, and an estimate keeps the assembly deterministic, so a resumed or replayed
search builds the same prompts on every machine. The provider's own count of the whole
prompt is recorded beside it as the call's tokens_in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pike.llm.call import PromptParts

Messages = list[dict[str, str]]
CountTokens = Callable[[str], int]

# How a part may shrink: never (always whole, even over the budget), whole (kept whole or
# dropped: half a program misleads), head (keep the first lines: the profile and the plan
# put what matters first), tail (keep the last lines: an error ends with its cause).
Cut = Literal["never", "whole", "head", "tail"]

_CHARS_PER_TOKEN = 4  # English prose runs near 4 characters a token, code a little under
_MAX_FITS = 8  # rounds of fitting the template's own words; each round only grows them


def estimate_tokens(text: str) -> int:
    """About how many tokens `text` is for an LLM's tokenizer (4 characters each)."""
    return -(-len(text) // _CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Part:
    """One named piece of a prompt; a higher priority is kept first."""

    name: str
    text: str
    priority: int
    cut: Cut = "whole"
    needs: str | None = None  # kept only with this part (a parent's profile, with the parent)


@dataclass
class Assembly:
    """What was kept of each part, and what it cost."""

    texts: dict[str, str] = field(default_factory=dict)  # kept text; "" when dropped
    tokens: dict[str, int] = field(default_factory=dict)  # kept tokens, per part
    trimmed: dict[str, int] = field(default_factory=dict)  # name -> tokens before trimming
    dropped: dict[str, int] = field(default_factory=dict)  # name -> tokens it needed
    optional_kept: bool = False  # whether any part that may shrink is still in

    def text(self, name: str) -> str:
        return self.texts.get(name, "")


def assemble(parts: Sequence[Part], budget: int | None,
             count: CountTokens = estimate_tokens) -> Assembly:
    """Keep `parts` within `budget` tokens (None: no limit), highest priority first.

    Required parts ('never') always stay and are paid for first. The others, by priority
    (ties in the order given), are kept whole while they fit; one that does not fit is
    trimmed at line boundaries if its cut allows, otherwise dropped, and the parts after it
    still get the room that is left.
    """
    result = Assembly()
    room = budget
    for part in parts:
        if part.cut == "never":
            result.texts[part.name] = part.text
            result.tokens[part.name] = count(part.text)
    if room is not None:
        room -= sum(result.tokens.values())
    # sorted() is stable: parts of one priority (the top programs) keep the order given
    for part in sorted((p for p in parts if p.cut != "never"), key=lambda p: -p.priority):
        need = count(part.text)
        if part.needs is not None and not result.texts.get(part.needs):
            text = ""  # what it describes is not in the prompt, so it would mislead
        elif room is None or need <= room:
            text = part.text
        else:
            text = _trim(part, room, count)
        result.texts[part.name], result.tokens[part.name] = text, count(text) if text else 0
        if text != part.text:
            (result.trimmed if text else result.dropped)[part.name] = need
        if text:
            result.optional_kept = True
        if room is not None:
            room -= result.tokens[part.name]
    return result


def _trim(part: Part, room: int, count: CountTokens) -> str:
    """As many whole lines of `part` as fit in `room` with a note of the cut; "" if none."""
    if part.cut not in ("head", "tail") or room <= 0:
        return ""
    lines = part.text.splitlines()
    if part.cut == "tail":
        lines.reverse()
    kept: list[str] = []
    for line in lines:
        note = _cut_note(part.cut, len(lines) - len(kept) - 1)
        if count("\n".join([*kept, line, note])) > room:
            break
        kept.append(line)
    if not kept:
        return ""
    note = _cut_note(part.cut, len(lines) - len(kept))
    return "\n".join(kept + [note] if part.cut == "head" else [note, *reversed(kept)])


def _cut_note(cut: Cut, lines: int) -> str:
    # Tell the model that something is missing, so it does not take a cut as the whole.
    return (f"[... {lines} more lines cut to fit the prompt]" if cut == "head"
            else f"[{lines} earlier lines cut to fit the prompt ...]")


class Prompt(list[dict[str, str]]):
    """Chat messages that also carry how they were assembled (`parts`), so the querier
    records it with the call; to every other caller it is a plain list of messages."""

    def __init__(self, messages: Messages, parts: PromptParts) -> None:
        super().__init__(messages)
        self.parts = parts


def fit(parts: Sequence[Part], budget: int | None, render: Callable[[Assembly], Messages],
        count: CountTokens = estimate_tokens) -> Prompt:
    """Assemble `parts` and render them into messages whose whole text, the template's own
    words ('frame') included, keeps within `budget` (None or 0: no limit) when the
    required parts allow it."""
    budget = budget or None
    frame = 0
    for _ in range(_MAX_FITS):
        assembly = assemble(parts, None if budget is None else budget - frame, count)
        messages = render(assembly)
        total = sum(count(m["content"]) for m in messages)
        measured = total - sum(assembly.tokens.values())
        if budget is None or total <= budget or not assembly.optional_kept or measured <= frame:
            break
        # The template's words around the kept parts took more than the last guess: leave
        # them that much room. The guess only grows, so this ends within a few rounds.
        frame = measured
    else:  # a pathological template: keep only what must be kept
        assembly = assemble(parts, -1, count)
        messages = render(assembly)
        total = sum(count(m["content"]) for m in messages)
    tokens = {**assembly.tokens, "frame": max(0, total - sum(assembly.tokens.values()))}
    return Prompt(messages, PromptParts(budget=budget, total=total, tokens=tokens,
                                        trimmed=assembly.trimmed, dropped=assembly.dropped))
