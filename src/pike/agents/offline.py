"""The offline agent: program transformations of the reference, no LLM.

Each transformation set renders one readable `ModelNew` source (templates/offline.j2):
the reference unchanged, wrapped. Transformations compose; `compatible` says which may.
"""

from __future__ import annotations

import re

from pike.agents.roles import _templates

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
ALL = ("sdpa", "inference_mode", "cuda_graph", "channels_last", "cudnn_benchmark", "tf32",
       "autocast_bf16", "autocast_fp16", *(f"compile:{m}" for m in COMPILE_MODES))
_CUDA_ONLY = {"cuda_graph", "cudnn_benchmark", "tf32", "autocast_bf16", "autocast_fp16",
              "compile:max-autotune-no-cudagraphs", "compile:reduce-overhead"}
_CONV = re.compile(r"\bConv[123]d\b|\bconv[123]d\b")
# attention written out: a softmax and a matrix product (the rewrite itself checks exactly)
_SOFTMAX = re.compile(r"\bsoftmax\b")
_MATMUL = re.compile(r"@|\bmatmul\b")
# On a GPU a search cut short by its budget should already have judged what pays most
# (measured on level3-pike: graphs on host-bound models, compile on kernel-bound ones),
# and the compile modes are also the baselines a user compares against.
_CUDA_ORDER = ("cuda_graph", "sdpa", "compile:default", "compile:max-autotune-no-cudagraphs",
               "compile:reduce-overhead", "tf32", "channels_last", "autocast_bf16",
               "cudnn_benchmark", "inference_mode", "autocast_fp16")


def applicable(task_source: str, device: str) -> list[str]:
    """Transformations worth trying for this task on this device: on CPU cheapest first,
    on CUDA most promising first."""
    on_cuda = device.startswith("cuda")
    conv = bool(_CONV.search(task_source))
    names = []
    for name in _CUDA_ORDER if on_cuda else ALL:
        if name in _CUDA_ONLY and not on_cuda:
            continue
        if name in ("channels_last", "cudnn_benchmark") and not conv:
            continue
        if name == "sdpa" and not (_SOFTMAX.search(task_source) and _MATMUL.search(task_source)):
            continue
        names.append(name)
    return names


def compatible(names: tuple[str, ...]) -> bool:
    """At most one compile mode and one autocast; reduce-overhead already uses graphs."""
    compiles = [n for n in names if n.startswith("compile:")]
    autocasts = [n for n in names if n.startswith("autocast_")]
    return (len(set(names)) == len(names) and len(compiles) <= 1 and len(autocasts) <= 1
            and not ("cuda_graph" in names and "compile:reduce-overhead" in names))


def render(task_source: str, names: tuple[str, ...]) -> str:
    """The ModelNew source for a set of transformations (in a canonical order)."""
    ordered = tuple(n for n in ALL if n in names)
    compile_mode = next((n.split(":", 1)[1] for n in ordered if n.startswith("compile:")), "")
    autocast = next((n.split("_", 1)[1].replace("bf16", "bfloat16").replace("fp16", "float16")
                     for n in ordered if n.startswith("autocast_")), "")
    return _templates().get_template("offline.j2").render(
        task_source=task_source.rstrip(), names=" + ".join(ordered), compile_mode=compile_mode,
        autocast=autocast).rstrip() + "\n"
