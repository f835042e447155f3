"""The reference child's torch.compile modes: each mode's own copy of the model, and the
throwaway pre-build of an autotuning mode.

A mode compiles its own copy, so a forward that keeps state on the module cannot hand
one mode's outputs to the next; a pre-build compiles once beside other evaluations and
keeps only the kernels, so the mode's own build, with the device held alone, mostly
measures them.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pike.evaluate.diagnostics import describe_exception


def prebuild_mode(model: torch.nn.Module, mode: str,
                  call_once: Callable[[Callable[..., Any]], object],
                  device: torch.device) -> None:
    """Compile a torch.compile `mode` of the model once (its own copy) and throw it away,
    keeping only what any build of the same code may share: its compiled kernels."""
    module, _ = own_copy(model)
    fn = torch.compile(module, mode=mode.split(":", 1)[1])
    try:
        with _results_not_kept(), torch.no_grad():
            call_once(fn)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        del fn, module
        # Nothing of this build may be reused as it is: the mode's own build traces,
        # compiles and autotunes again (its kernels then come from the caches on disk).
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()


@contextlib.contextmanager
def _results_not_kept() -> Iterator[None]:
    """Inductor's caches of whole results off: the compiled graph (whose kernels are
    the ones autotuning chose), the AOT autograd graph that holds it, and the autotuning
    timings. A pre-build's autotuning runs beside other evaluations, so its choices are
    not the mode's; its compiled kernels are the same code either way and stay (Triton's
    binaries; C++ kernels in inductor's cache). Options this torch does not have are left
    alone; where it has no way to keep timings off the disk, there is no pre-build.

    autotune_local_cache=False stops reading the kept timings, not writing them: the
    algorithm selection's lookup writes its fresh timings to the cache file all the same
    (helper-22's review: the mode's own build then took the pre-build's GEMM timings from
    there), so the write itself is made a no-op here. With the option off, the generated
    Triton sources (their inductor_meta names it) differ from the own build's, so no kernel
    object the pre-build autotuned is found again in memory."""
    import unittest.mock

    import torch._functorch.config as functorch_config
    import torch._inductor.codecache as codecache
    import torch._inductor.config as inductor_config
    if not callable(getattr(getattr(codecache, "CacheBase", None), "update_local_cache", None)):
        raise RuntimeError("this torch keeps autotuning timings otherwise: no pre-build")
    patches = [(inductor_config, {"fx_graph_cache": False, "autotune_local_cache": False,
                                  "autotune_remote_cache": False}),
               (functorch_config, {"enable_autograd_cache": False})]
    with contextlib.ExitStack() as stack:
        for module, options in patches:
            known = {k: v for k, v in options.items() if hasattr(module, k)}
            stack.enter_context(module.patch(known))
        stack.enter_context(unittest.mock.patch.object(
            codecache.CacheBase, "update_local_cache", lambda self, local_cache: None))
        yield


def own_copy(model: torch.nn.Module) -> tuple[torch.nn.Module, str | None]:
    """A compile mode's own module, with the same weights: a forward that keeps state on
    the module (an RNN's hidden state, a decoder's cache) would otherwise carry one mode's
    outputs into the next mode's calls (33_VanillaRNN: eager was handed a CUDA graph's
    output, since overwritten, and failed). The module is shared, as before, and the
    reason given, where its weights would take over a quarter of the device memory free
    to this process (a level-5 model: the compiled modes need that room for their own
    buffers) or deepcopy refuses it. Hooks are copied by reference: one that closes over
    the original's tensors still reaches them."""
    on_device = _on_device(model)
    weights = sum(t.numel() * t.element_size() for t in on_device)
    free = _free_bytes(on_device[0].device) if on_device else None
    if free is not None and weights > free * COPY_SHARE_OF_FREE:
        return model, (f"shares eager's module: its weights ({weights / 2**30:.2f} GiB) are "
                       f"over a quarter of the free device memory ({free / 2**30:.2f} GiB)")
    try:
        return copy.deepcopy(model), None
    except Exception as exc:  # noqa: BLE001 - any failure to copy leaves the shared module
        return model, ("shares eager's module: it could not be copied: "
                       + describe_exception(exc).splitlines()[0][:200])


COPY_SHARE_OF_FREE = 0.25


def _on_device(model: torch.nn.Module) -> list[torch.Tensor]:
    """The module's tensors off the host: parameters, buffers and plain tensor attributes
    (KernelBench tasks keep some as `self.bias = torch.randn(...)`)."""
    tensors = {id(t): t for m in model.modules()
               for t in (*m.parameters(recurse=False), *m.buffers(recurse=False),
                         *(v for v in vars(m).values() if isinstance(v, torch.Tensor)))}
    return [t for t in tensors.values() if t.device.type != "cpu"]


def _free_bytes(device: torch.device) -> int | None:
    """Device memory this process could still use: free on the card plus what its caching
    allocator holds unused; None for a device that does not say."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
