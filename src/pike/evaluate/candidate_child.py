"""A candidate's launched child: a waiting spare (spares.py), or a new one, and the key
spares are kept under.
"""

from __future__ import annotations

import os

from pike.config import EvalConfig
from pike.evaluate import spares
from pike.evaluate.candidate_files import _sha, candidate_folders, fill_candidate
from pike.evaluate.child_environment import passed_to_child
from pike.evaluate.child_launch import launch_child
from pike.evaluate.leftovers import make_temp_dir, remove_tree
from pike.evaluate.os_sandbox import sandbox_problem
from pike.task import Task


def _candidate_child(task: Task, source: str, cfg: EvalConfig, device: str) -> spares.Launched:
    """A launched child for this candidate: a waiting spare, or a new one."""
    key = _spare_key(cfg, device)
    launched = spares.take(key) or _launch_candidate(cfg, device)
    if device.startswith("cuda"):  # its imports run on the build cores, beside this one
        spares.replenish(key, lambda: _launch_candidate(cfg, device))
    fill_candidate(launched.files, task, source, cfg, launched.child.see)
    return launched


def _launch_candidate(cfg: EvalConfig, device: str) -> spares.Launched:
    folder = make_temp_dir("cand")
    try:
        files = candidate_folders(cfg, device, folder)
        child = launch_child(files.request, files.work_dir, cfg, build_key="pending")
    except BaseException:
        remove_tree(folder)
        raise
    return spares.Launched(folder, child, files)


def _spare_key(cfg: EvalConfig, device: str) -> str:
    """Spares serve evaluations with the same settings on the same device, and the same
    environment as their launch gave them (the variables a child is passed, whether the
    OS sandbox works)."""
    passed = sorted((k, v) for k, v in os.environ.items() if passed_to_child(k))
    return "|".join([device, cfg.model_dump_json(exclude={"device"}),
                     str(sandbox_problem()), _sha(repr(passed))])
