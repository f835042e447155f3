"""Named PIKE-O configurations: the OpenEvolve-like default and the paper's ablation chain
towards exploit-heavy search. Each preset is the one before it plus one change, so runs
of neighbouring presets isolate that change.
"""

from __future__ import annotations

from pike.config import EvolveConfig
from pike.errors import ConfigError

_CHAIN: list[tuple[str, str, dict[str, object]]] = [
    ("openevolve", "3 islands, explore-heavy parent selection, crossover prompts, "
     "4 evaluations in parallel",
     {"islands": 3, "population_size": 50, "archive_size": 20, "num_top_programs": 5,
      "exploration_ratio": 0.5, "exploitation_ratio": 0.3, "elite_selection_ratio": 0.1,
      "template": "crossover", "parallel_evaluations": 4}),
    ("mutation", "as openevolve, with mutation prompts (one parent, full rewrite)",
     {"template": "mutation"}),
    ("serial", "as mutation, one evaluation at a time (no parallel evaluation)",
     {"parallel_evaluations": 1}),
    ("one-island", "as serial, with a single island", {"islands": 1}),
    ("exploit", "as one-island, every parent a library elite",
     {"exploitation_ratio": 1.0, "exploration_ratio": 0.0}),
    ("exploit-small-library", "as exploit, with a small library: population 25, archive 12, "
     "elite share 0.2, 3 top programs",
     {"population_size": 25, "archive_size": 12, "elite_selection_ratio": 0.2,
      "num_top_programs": 3}),
]

PRESETS: dict[str, str] = {name: doc for name, doc, _ in _CHAIN}


def preset(name: str, base: EvolveConfig | None = None) -> EvolveConfig:
    """The named configuration: the chain's changes up to `name`, over `base`'s seed and
    fix attempts (which no preset changes)."""
    names = [n for n, _, _ in _CHAIN]
    if name not in names:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(names)}")
    values = (base or EvolveConfig()).model_dump()
    for step_name, _, changes in _CHAIN[:names.index(name) + 1]:
        values.update(changes)
        if step_name == name:
            break
    return EvolveConfig.model_validate(values)
