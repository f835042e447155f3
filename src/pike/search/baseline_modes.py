"""What a task's stored baseline says of its torch.compile modes, as the searches read it:
the fastest correct one, each one's speedup and build time, those no faster than eager and
those not worth a candidate."""

from __future__ import annotations

from typing import Any


def fastest_mode(baseline: object) -> str | None:
    """The torch.compile mode a stored baseline found fastest among those it checked
    against eager and found correct; None where none was (or no baseline is stored)."""
    rows = [m for m in _compile_rows(baseline) if m.get("checked") is True
            and not m.get("error") and isinstance(m.get("speedup_vs_eager"), (int, float))]
    return str(max(rows, key=lambda m: m["speedup_vs_eager"])["mode"]) if rows else None


def compile_build_seconds(baseline: object) -> dict[str, float]:
    """Each torch.compile mode's build seconds in a stored baseline (pre-build included)."""
    return {m["mode"]: float(m["build_s"]) for m in _compile_rows(baseline)
            if isinstance(m.get("build_s"), (int, float))}


def compile_speedups(baseline: object) -> dict[str, float]:
    """Each torch.compile mode's speedup over eager in a stored baseline (a campaign
    measures every task's before its search); empty where there is none."""
    return {m["mode"]: float(m["speedup_vs_eager"]) for m in _compile_rows(baseline)
            if isinstance(m.get("speedup_vs_eager"), (int, float))}


def _compile_rows(baseline: object) -> list[dict[str, Any]]:
    """A stored baseline's torch.compile modes, as stored; none where it is not one."""
    if not isinstance(baseline, dict):
        return []
    return [m for m in baseline.get("modes", [])
            if isinstance(m, dict) and str(m.get("mode", "")).startswith("compile:")]


# A compile mode its baseline found under this much faster than eager is not judged alone.
NO_GAIN = 1.05


def no_gain_modes(baseline: object) -> dict[str, float]:
    """torch.compile modes the task's baseline measured, checked against eager, and found
    no faster than eager (under NO_GAIN): their speedup there. Judged alone, each would
    hold a lane for a build of a minute or more to say what the baseline said; the offline
    search tries them only in company of its best set (or alone where nothing else is
    correct). A mode measured before pike checked modes (`checked` missing) is not one."""
    return {str(m["mode"]): float(m["speedup_vs_eager"]) for m in _compile_rows(baseline)
            if m.get("checked") is True and not m.get("error")
            and isinstance(m.get("speedup_vs_eager"), (int, float))
            and m["speedup_vs_eager"] < NO_GAIN}


def hopeless_modes(baseline: object, timeouts: bool = True) -> dict[str, str]:
    """torch.compile modes not worth a candidate, with why: the task's baseline found the
    mode answering otherwise than eager on the check trials' inputs (a candidate of it is
    judged on the same ones), or, with `timeouts` (the baseline's build limit is at least
    the candidate's, whose compile runs in its check phase), its build making no progress
    for that limit with every build core (a candidate builds with fewer and would hold its
    lane that long to fail the same way)."""
    found = {}
    for m in _compile_rows(baseline):
        error = str(m.get("error") or "")
        if error.startswith("incorrect:") or timeouts and "no progress for" in error:
            found[str(m["mode"])] = error.splitlines()[0][:160]
    return found


