"""A candidate's folders under its temp dir, its source, the request its child is started
with and its build key; the reference's part of them (its seed, the stage its inputs come
through) once the reference is known.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pike.config import EvalConfig
from pike.evaluate.candidate_limits import first_call_limit
from pike.evaluate.child_launch import build_cache_root
from pike.evaluate.disk_use import disk_limit_bytes
from pike.evaluate.protocol import ChildRequest, timed_set_count
from pike.evaluate.reference import ReferenceRun
from pike.evaluate.reference_start import child_protocol
from pike.evaluate.staging import InputStage
from pike.task import Task


def _input_stage(reference: ReferenceRun, folder: Path, cfg: EvalConfig) -> InputStage:
    trials = [f"inputs_{t}.pt" for t in range(cfg.trials + cfg.guards)]
    stage = InputStage(reference.inputs_dir, folder, {
        "warm_up": trials[:1], "check": trials,
        "timing": [f"pool_{k}.pt" for k in range(timed_set_count(cfg.timing.input_sets))],
        "final": [f"inputs_{cfg.trials + 1}.pt"]})
    if cfg.warm_up:
        stage.permitted.add("warm_up")
    return stage


@dataclass
class CandidateFiles:
    """A candidate's folders under its temp dir, its child's request and its build key;
    `stage` once the reference is known (`attach_reference`)."""

    work_dir: Path
    outputs_dir: Path
    source_path: Path
    request: ChildRequest
    build_key: str
    stage: InputStage | None = None
    # the warm-up call's limit where the candidate builds there (`first_call_limit`), read
    # from the source as written: the child can change its file once it has begun
    first_call_limit_s: float | None = None


def candidate_files(task: Task, source: str, cfg: EvalConfig, device: str,
                    reference: ReferenceRun, folder: Path) -> CandidateFiles:
    """Write a candidate's source into `folder`/work and make its outputs and staged
    inputs folders; the request its child is started with."""
    files = candidate_folders(cfg, device, folder)
    fill_candidate(files, task, source, cfg)
    attach_reference(files, reference, cfg)
    return files


def candidate_folders(cfg: EvalConfig, device: str, folder: Path) -> CandidateFiles:
    """A candidate's folders and a request with its paths: enough to launch its child,
    before the candidate (`fill_candidate`) and the reference (`attach_reference`) are
    known."""
    work_dir, outputs_dir, inputs_dir = folder / "work", folder / "outputs", folder / "inputs"
    work_dir.mkdir(parents=True)
    outputs_dir.mkdir()
    inputs_dir.mkdir()
    request = ChildRequest(
        role="candidate", module_path=str(work_dir / "candidate.py"),
        class_names=["ModelNew", "Model"], inputs_dir=str(inputs_dir),
        outputs_dir=str(outputs_dir), device=device, **child_protocol(cfg), seed=0,
        guards=cfg.guards, warm_up=cfg.warm_up,
    )
    return CandidateFiles(work_dir, outputs_dir, work_dir / "candidate.py", request, "")


def fill_candidate(files: CandidateFiles, task: Task, source: str, cfg: EvalConfig,
                   see: Callable[[str], str] = str) -> None:
    """The candidate's part: its source, its task's fingerprint and its build folder
    (`see`: a host path as its child sees it, for a child already launched; one not yet
    launched gets its paths mapped by `launch_child`)."""
    files.source_path.write_text(source)
    files.first_call_limit_s = first_call_limit(source, cfg)
    files.build_key = task.sha256[:8] + "-" + _sha(source)[:16]
    files.request.task_sha256, files.request.task_size = task.sha256, task.path.stat().st_size
    files.request.extensions_dir = see(str(build_cache_root(cfg) / files.build_key))


def attach_reference(files: CandidateFiles, reference: ReferenceRun, cfg: EvalConfig) -> None:
    """The reference's part of a candidate's request: its weights seed, the bound on its
    files (which its outputs set), and the stage its inputs come through."""
    files.request.seed = reference.seed
    files.request.file_bytes_limit = disk_limit_bytes(cfg.limits, reference.trial_output_bytes(),
                                                      cfg.trials)
    if reference.request is not None:
        files.request.construct_on = reference.request.construct_on
    files.stage = _input_stage(reference, files.work_dir.parent / "inputs", cfg)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
