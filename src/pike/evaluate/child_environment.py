"""An evaluation child's environment: an allow-list of pike's own, with HOME, TMPDIR and
every cache moved into the child's own folders, and the marker that finds its processes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MARKER_VARIABLE = "PIKE_EVAL_MARKER"

# The child's environment is built from an allow-list: what Python, torch, CUDA, the
# compilers and pike itself read. Anything else (DATABASE_URL, GITHUB_PAT, MYSQL_PWD,
# cloud credentials ...) never reaches candidate code, whatever its name.
_ALLOWED_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH",
    "PYTHONPATH", "PYTHONHASHSEED", "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "MAX_JOBS",
    "OMP_NUM_THREADS", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING", "CUDA_DEVICE_ORDER", "CUBLAS_WORKSPACE_CONFIG",
    "TORCH_CUDA_ARCH_LIST", "TORCH_USE_CUDA_DSA", "TORCH_SHOW_CPP_STACKTRACES",
})
_ALLOWED_PREFIXES = ("LC_", "NVIDIA_", "PYTORCH_", "TORCHINDUCTOR_", "TORCH_LOGS", "TRITON_",
                     "MKL_", "KMP_", "OPENBLAS_", "NCCL_", "NVCC_", "PIKE_")
# Never passed, even where a prefix allows: pike's own settings that name secrets or
# places outside the sandbox.
_NEVER = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PWD", "AUTH")


def passed_to_child(name: str) -> bool:
    """Whether the variable `name` of pike's environment reaches an evaluation child."""
    upper = name.upper()
    if any(part in upper for part in _NEVER) or upper.endswith("_PAT") or "_PAT_" in upper:
        return False
    return upper in _ALLOWED_NAMES or upper.startswith(_ALLOWED_PREFIXES)


def _without_home(value: str, keep: tuple[str, ...]) -> str:
    """A path list without the entries under the real home (other than `keep`)."""
    home = os.path.realpath(Path.home())
    parts = [p for p in value.split(os.pathsep)
             if not (os.path.realpath(p) == home or os.path.realpath(p).startswith(home + os.sep))
             or os.path.realpath(p) in keep]
    return os.pathsep.join(parts)


def child_environment(work_dir: str, marker: str, build_dir: str, cache_root: str,
                      compile_threads: int = 1) -> dict[str, str]:
    """The allow-listed part of pike's environment, with HOME, TMPDIR and every cache
    inside the child's own folders (paths as the child sees them)."""
    python_bin = (os.path.dirname(os.path.realpath(sys.executable)),
                  os.path.dirname(os.path.abspath(sys.executable)))
    env = {k: v for k, v in os.environ.items() if passed_to_child(k)}
    for name in ("PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "PYTHONPATH"):
        if name in env:
            env[name] = _without_home(env[name], python_bin)
    if python_bin[1] not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join([python_bin[1], env.get("PATH", "/usr/bin:/bin")])
    home, tmp = f"{work_dir}/home", f"{work_dir}/tmp"
    env.update(
        HOME=home, TMPDIR=tmp, TMP=tmp, TEMP=tmp,
        XDG_CACHE_HOME=f"{home}/.cache", XDG_CONFIG_HOME=f"{home}/.config",
        TORCH_EXTENSIONS_DIR=build_dir,
        TRITON_CACHE_DIR=f"{cache_root}/triton",
        TORCHINDUCTOR_CACHE_DIR=f"{cache_root}/inductor",
        # 1: compile in-process; more: a pool of workers the child shuts down as it ends
        TORCHINDUCTOR_COMPILE_THREADS=str(compile_threads),
        PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
        **{MARKER_VARIABLE: marker},
    )
    return env


def make_child_dirs(work_dir: Path) -> None:
    (work_dir / "home").mkdir(exist_ok=True)
    (work_dir / "tmp").mkdir(exist_ok=True)
