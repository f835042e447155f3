"""What runs inside the child process: load a module, construct it, run trials, time it.

Run as `python -m pike.evaluate.runner REQUEST_JSON WRITE_FD READ_FD`; the request file is
written, and "begin" said on READ_FD, once the parent is ready for the child (a reference's
child may be asked its task's "size" first, task_size.py). The reference role
draws the trial inputs and records the expected outputs (reference_role.py); the candidate role
never sees the reference class or its outputs, only the inputs and the constructor arguments
(candidate_role.py). Both then serve the parent's requests (child_serving.py).
"""

from __future__ import annotations

import faulthandler
import getpass
import os
import platform
import re
import sys
import tempfile
from pathlib import Path

import torch

from pike.evaluate import syscall_filter, task_size
from pike.evaluate.candidate_role import run_candidate
from pike.evaluate.child_setup import Failure
from pike.evaluate.device_identity import identity
from pike.evaluate.protocol import DESCENDANTS_GRACE_S, Channel, ChildRequest
from pike.evaluate.reference_role import run_reference

# The evaluator's own files live for one evaluation in its own folders; a checksum of
# every gigabyte written costs time and protects nothing a candidate could not redo.
if hasattr(torch.serialization, "set_crc32_options"):  # torch 2.5 and later
    torch.serialization.set_crc32_options(False)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def main(argv: list[str]) -> int:
    faulthandler.enable()
    chan = Channel(int(argv[1]), int(argv[2]))
    # Started ahead of its request (the imports above take seconds): the parent writes
    # the request and says "begin" when the reference is ready and the device is held.
    first = chan.receive()
    while first is not None and first.get("event") == "size":  # a reference, before its room
        chan.send("size", **task_size.on_meta(str(first.get("module_path", ""))))
        first = chan.receive()
    if first is None or first.get("event") != "begin":
        os._exit(0)  # not needed after all: nothing was loaded, nothing to report
    req = ChildRequest.model_validate_json(Path(argv[0]).read_text())
    syscalls = "off: not a candidate's child"
    if req.file_bytes_limit:  # before the candidate's code, which cannot undo either
        syscalls = syscall_filter.confine(req.file_bytes_limit)
    if req.extensions_dir:  # known only now to a child started ahead of its candidate
        os.environ["TORCH_EXTENSIONS_DIR"] = req.extensions_dir
    _share_precompiled_headers()
    # Said outright in every child, as the reference's says it before its timed modes:
    # inductor's graph cache keys on how it was set ('ieee' said, 'none' left alone), so a
    # candidate left at 'none' never found the baseline's build (shared_builds). The
    # candidate may change it; its verdict lists the change.
    torch.set_float32_matmul_precision("highest")
    device = torch.device(req.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    chan.send("env", device_name=_device_name(device), torch_version=torch.__version__,
              host=platform.node(), device_id=identity(str(device)), syscall_filter=syscalls)
    chan.send("phase", phase="load")
    try:
        (run_reference if req.role == "reference" else run_candidate)(req, chan, device)
    except Failure as failure:
        chan.send("failure", status=failure.status, phase=failure.phase, message=failure.message)
    else:
        chan.send("done")
    _stop_compile_workers()
    _wait_for_descendants(DESCENDANTS_GRACE_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: candidate atexit hooks and threads are not ours


def inductor_temp_dir() -> Path:
    """Where inductor keeps what it means to outlive a cache reset (its precompiled
    headers): torchinductor_<user> in the temp dir. Worked out as torch does, since
    importing torch's own function takes 2 s (tests compare the two)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    safe = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Path(tempfile.gettempdir()) / f"torchinductor_{safe}"


def _share_precompiled_headers() -> None:
    """Inductor precompiles a C++ header for its CPU kernels and keeps it under the temp
    dir, which is each child's own: every child that compiled for the CPU built the same
    header again (10 s and more). A link from there into inductor's cache in the shared
    build cache lets one build serve every child: no new trust, as that cache is already
    shared (docs/guards.md). Only a saving: nothing fails without it."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        return
    shared, local = Path(cache) / "precompiled_headers", inductor_temp_dir() / "precompiled_headers"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        if not local.exists():
            local.symlink_to(shared, target_is_directory=True)
    except OSError as err:
        print(f"pike: precompiled headers not shared ({err})", file=sys.stderr)


def _wait_for_descendants(grace_s: float) -> None:
    """Give the processes this child started (inductor's compile workers and their own
    pool, which stop asynchronously after shutdown) a moment to end, so a worker that is
    still exiting is not taken for a process left behind. Nothing is killed here: what
    outlives the grace is the parent's to report and kill."""
    try:
        import psutil

        psutil.wait_procs(psutil.Process().children(recursive=True), timeout=grace_s)
    except Exception:  # best effort: the parent still checks and cleans up
        pass


def _stop_compile_workers() -> None:
    """Inductor's pool of compile workers (eval.compile_threads > 1): the child skips the
    interpreter's teardown, which would otherwise stop it; a worker still running after
    the child would count as a process left behind."""
    if os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "1") == "1":
        return
    if "torch._inductor.async_compile" not in sys.modules:
        return  # nothing compiled
    try:
        sys.modules["torch._inductor.async_compile"].shutdown_compile_workers()
    except Exception:  # a candidate may have broken it; the parent still kills what is left
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
