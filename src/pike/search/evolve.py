"""PIKE-O: island-based evolution in the style of OpenEvolve, with the error fixer.

Each generation sends `parallel_evaluations` queries; query i of generation g works on
island (g * P + i) mod islands. Its parent is, with probability exploration_ratio, a random
program of the island, with exploitation_ratio an elite of the library (archive), and
otherwise one of the island's top `elite_selection_ratio` share. Crossover prompts carry a
second parent. Fitness is the speedup; incorrect programs stay in the database as negative
examples (fitness -1) and the latest one of the island is shown to the model.

The program database is not stored separately: it is rebuilt from the run store by
replaying generations (population limits and ring migration every migration_interval
generations), and every random choice comes from a generator seeded with (seed, g, i).
So a resumed or replayed run makes the same choices as the original.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from pike.agents import ProgramView, evolve_messages
from pike.config import EvolveConfig
from pike.search.base import LLMSearch


@dataclass(frozen=True)
class Program:
    id: int
    source: str
    fitness: float  # speedup when correct, -1 otherwise
    ok: bool
    island: int
    generation: int
    status: str
    message: str

    def view(self) -> ProgramView:
        speedup = f"{self.fitness:.2f}x" if self.ok else "failed"
        return ProgramView(self.source, speedup, self.status, self.message[:500])


class EvolveSearch(LLMSearch):
    def __init__(self, *args: Any, cfg: EvolveConfig, **kwargs: Any) -> None:
        super().__init__(*args, max_fix_attempts=cfg.max_fix_attempts, **kwargs)
        self.cfg = cfg

    def run(self) -> None:
        self.judge_pending()
        self.fix_seeds()
        generation = 0
        while self.querier.ledger.has_room():
            self.on_event("round", round=generation, branches=self.cfg.parallel_evaluations)
            populations = self.populations(generation)
            archive = self.archive(generation)
            steps: list[str] = []
            if self.planner:  # planned from the library's best (the reference at first)
                best = self.store.candidate(archive[0].id) if archive else None
                planned = self.plan(generation, best.source if best else None,
                                    best.verdict if best else None,
                                    self.cfg.parallel_evaluations)
                if planned is None:
                    return
                steps = planned
            asks, plans = [], []
            for slot in range(self.cfg.parallel_evaluations):
                island = (generation * self.cfg.parallel_evaluations + slot) % self.cfg.islands
                rng = random.Random(f"{self.cfg.seed}:{generation}:{slot}")
                parent, other = self.select(rng, populations[island], archive)
                top = [p.view() for p in archive[:self.cfg.num_top_programs]]
                failed = next((p.view() for p in reversed(populations[island]) if not p.ok), None)
                messages = evolve_messages(self.ctx, parent.view() if parent else None,
                                           other.view() if other else None, top, failed,
                                           steps[slot % len(steps)] if steps else None)
                asks.append((f"evolve:{generation}:{slot}", messages))
                plans.append((island, parent, "crossover" if other else "mutation"))
            calls = self.ask_parallel(asks)
            made, slots = [], []
            for slot, ((island, parent, kind), call) in enumerate(zip(plans, calls, strict=True)):
                if call is not None:
                    made.append((call, parent.id if parent else None, "evolve", generation,
                                 island, kind))
                    slots.append(slot)
            latest = dict(zip(slots, self.candidates(made), strict=True))
            self.fix_chains(generation, latest)
            if not latest:
                return  # nothing of this generation could be asked: the budget is spent
            generation += 1

    # ---- the program database, rebuilt from the store ----------------------------------

    def programs(self, before_generation: int) -> list[Program]:
        found = []
        for row in self.store.candidates(self.task):
            if row.role not in ("evolve", "fix", "offline", "seed") or row.verdict is None:
                continue
            # offline candidates (--seed-offline) and a solution set's files (--seed-from)
            # are there before the first generation: the start of PIKE-O's library
            generation = -1 if row.role in ("offline", "seed") else row.round
            if generation >= before_generation:
                continue
            ok = row.verdict.ok and bool(row.verdict.speedup)
            found.append(Program(row.id, row.source, row.verdict.speedup if ok else -1.0, ok,
                                 row.branch, generation, row.verdict.status,
                                 row.verdict.message))
        return found

    def populations(self, generation: int) -> list[list[Program]]:
        """Each island's programs at the start of `generation`, best first."""
        pops: list[list[Program]] = [[] for _ in range(self.cfg.islands)]
        everything = self.programs(generation)
        for gen in range(-1, generation):
            for program in everything:
                if program.generation == gen:
                    pops[program.island % self.cfg.islands].append(program)
            pops = [self._trim(pop) for pop in pops]
            if (gen + 1) % self.cfg.migration_interval == 0 and self.cfg.islands > 1:
                pops = self._migrate(pops)
        return pops

    def _trim(self, pop: list[Program]) -> list[Program]:
        ranked = sorted(pop, key=lambda p: (-p.fitness, p.id))
        return ranked[:self.cfg.population_size]

    def _migrate(self, pops: list[list[Program]]) -> list[list[Program]]:
        """Ring migration: each island's best share joins the next island."""
        moved = [list(pop) for pop in pops]
        for k, pop in enumerate(pops):
            correct = [p for p in pop if p.ok]
            count = math.ceil(self.cfg.migration_rate * len(correct)) if correct else 0
            target = moved[(k + 1) % len(pops)]
            for program in correct[:count]:
                if all(p.id != program.id for p in target):
                    target.append(program)
        return [self._trim(pop) for pop in moved]

    def archive(self, generation: int) -> list[Program]:
        """The solution library: the best correct programs so far, across islands."""
        correct = [p for p in self.programs(generation) if p.ok]
        return sorted(correct, key=lambda p: (-p.fitness, p.id))[:self.cfg.archive_size]

    def select(self, rng: random.Random, island: list[Program], archive: list[Program]
               ) -> tuple[Program | None, Program | None]:
        """A parent (None: the reference) and, for crossover, a second one."""
        roll = rng.random()
        if roll < self.cfg.exploration_ratio and island:
            parent = rng.choice(island)
        elif roll < self.cfg.exploration_ratio + self.cfg.exploitation_ratio:
            parent = rng.choice(archive) if archive else None
        else:
            correct = [p for p in island if p.ok]
            elites = correct[:max(1, math.ceil(self.cfg.elite_selection_ratio * len(correct)))]
            parent = rng.choice(elites) if elites else (rng.choice(archive) if archive else None)
        if parent is None or self.cfg.template != "crossover":
            return parent, None
        others = [p for p in archive + island if p.ok and p.id != parent.id]
        return parent, (rng.choice(others) if others else None)
