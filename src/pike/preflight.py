"""Checks that can fail before a run starts its work: model specs and their API keys, the
devices asked for, the Ray backend, the OS sandbox, a seed set's matching, the run folder.

The CLI runs them before any progress display starts, so that a mistake is one line on
its own, found in seconds, rather than an error cut into a status line after the
baselines were measured. Each raises the typed error the run itself would raise later.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch

from pike.config import EvalConfig, RunConfig
from pike.errors import ConfigError, EvaluatorError, StoreError
from pike.store import STORE_FILE
from pike.task import Task


def check_models(cfg: RunConfig) -> None:
    """Every model the run will call parses as a spec and has its API key set."""
    if not cfg.llm.model:
        return  # the offline strategy: no model is called, not even a configured fixer
    from pike.llm import LLMClient  # the openai SDK, only for runs that use an LLM

    for spec in dict.fromkeys(s for s in (cfg.llm.model, cfg.llm.fixer) if s):
        # the client checks the spec and the key as the run's own clients will
        LLMClient(spec).close()


def check_devices(cfg: EvalConfig) -> None:
    """The device and the pool's devices exist here; the Ray backend is installed; the OS
    sandbox runs where it is required (and warns now, once, where it is not)."""
    if cfg.cluster == "ray":
        if importlib.util.find_spec("ray") is None:
            raise ConfigError("the Ray backend needs Ray: pip install 'ray>=2.9' "
                              "(pike's [ray] extra)")
        return  # devices and sandboxes are the cluster's nodes', checked when they join
    for device in dict.fromkeys([cfg.device, *cfg.devices]):
        check_device(device)
    from pike.evaluate.os_sandbox import sandbox_active

    sandbox_active(cfg.sandbox)


def check_device(device: str | None) -> None:
    """A CUDA device asked for exists on this host (None: whatever is there is used)."""
    if not device or not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise EvaluatorError(f"device {device} asked for, but CUDA is not available here")
    index = device.partition(":")[2]
    count = torch.cuda.device_count()
    if index.isdigit() and int(index) >= count:
        raise EvaluatorError(f"device {device} asked for, but this host has {count} GPU"
                             + ("" if count == 1 else "s"))


def check_new_run_dir(run_dir: Path | None) -> None:
    """A new run's folder holds no run yet (None: a fresh folder is named later)."""
    if run_dir is not None and (Path(run_dir) / STORE_FILE).exists():
        raise StoreError(f"a pike run already exists at {run_dir}; resume it or pick "
                         "another folder")


def check_seed_set(cfg: RunConfig, tasks: Sequence[Task]) -> None:
    """The solution set a search seeds from (search.seed_from) matches its files to the
    tasks: a missing folder or a bad mapping or manifest fails here, not mid-run."""
    if cfg.search.seed_from is None or not tasks:
        return
    from pike.audit.matching import match

    match(cfg.search.seed_from, list(tasks))


def check_run(cfg: RunConfig, *, calls_llm: bool = True, out: Path | None = None,
              tasks: Sequence[Task] = ()) -> None:
    """Everything a search or campaign with `cfg` over `tasks` needs before it starts;
    `calls_llm` is False for a replay, which answers from the recorded run."""
    check_devices(cfg.eval)
    if calls_llm:
        check_models(cfg)
    check_seed_set(cfg, tasks)
    check_new_run_dir(out)
