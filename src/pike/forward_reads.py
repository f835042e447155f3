"""What one forward reads: which aten ops it ran (and whether any attention was causal),
and which bytes of its inputs', parameters' and buffers' storages those ops used, for
count_work's bytes_min (pike.work_count).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class _OpRecorder(TorchDispatchMode):
    """Records which aten ops ran, and whether any attention was causal."""

    def __init__(self, leaves: set[int] | None = None) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}
        self.views: set[str] = set()
        self.causal = False
        self.leaves = leaves or set()  # storages of inputs, parameters and buffers
        self.reads: dict[int, _StorageReads] = {}  # leaf storage -> what ops used of it

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(getattr(func, "overloadpacket", func))
        self.ops[name] = self.ops.get(name, 0) + 1
        if name in ("aten.tril", "aten.triu", "aten.tril_", "aten.triu_"):
            self.causal = True
        schema = getattr(func, "_schema", None)
        for i, arg in enumerate(schema.arguments if schema is not None else ()):
            if arg.name == "is_causal":
                self.causal |= bool(args[i] if i < len(args) else kwargs.get("is_causal", False))
        out = func(*args, **kwargs)
        if getattr(func, "is_view", False):
            self.views.add(name)  # a view moves nothing; the op that uses it does
        elif name not in _METADATA_ONLY:
            # An index op reads of its table at most what it gathers (an embedding reads
            # the rows it looks up), however large the table is.
            table = args[0] if name in _INDEX_OPS and args else None
            cap = _nbytes(_tensors(out)) if table is not None else None
            for t in _tensors((args, kwargs)):
                key = _storage_key(t)
                if key is not None and key in self.leaves:
                    self.reads.setdefault(key, _StorageReads(t.untyped_storage().nbytes())
                                          ).add(t, cap if t is table else None)
        return out


# Ops that take a tensor only for its shape, dtype and device, or change only its
# metadata in place: they read none of its data.
_METADATA_ONLY = frozenset(f"aten.{op}" for op in (
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
    "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided",
    "unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_",
    "resize_", "resize_as_", "set_", "detach_"))
# Ops that gather part of their first argument (a table) by indices: what they read of the
# table is at most what they return (lookups of one row repeated count each time).
_INDEX_OPS = frozenset(f"aten.{op}" for op in (
    "embedding", "index_select", "gather", "index", "take"))
_MAX_RUNS = 1 << 16  # contiguous runs of one view listed exactly; more are summed instead


class _StorageReads:
    """The bytes of one storage the forward's ops used: the union of the byte ranges of
    every view read (two chunks of one tensor count twice as much as one, one slice read
    twice counts once), as exact runs where a view splits into few contiguous runs, else
    the largest such view alone; never more than the storage holds."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.runs: list[tuple[int, int]] = []  # [start, end) in bytes
        self.largest_scattered = 0  # a view of too many runs to list: its distinct bytes
        self._merge_at = 4 * _MAX_RUNS  # doubled after each merge: merging stays n log n

    def add(self, t: torch.Tensor, cap: int | None = None) -> None:
        distinct = _view_bytes(t)
        if cap is not None and cap < distinct:  # an index op gathered part of it
            self.largest_scattered = max(self.largest_scattered, cap)
            return
        runs = _contiguous_runs(t)
        if runs is None:
            self.largest_scattered = max(self.largest_scattered, distinct)
            return
        self.runs.extend(runs)
        if len(self.runs) > self._merge_at:
            self.runs = _merged(self.runs)
            self._merge_at = max(self._merge_at, 2 * len(self.runs))

    def total(self) -> int:
        covered = sum(end - start for start, end in _merged(self.runs))
        return min(max(covered, self.largest_scattered), self.capacity)


def _contiguous_runs(t: torch.Tensor) -> list[tuple[int, int]] | None:
    """The byte ranges a view covers, one per contiguous run, or None where it has more
    than _MAX_RUNS runs (a column of a large matrix) or strides pike cannot order."""
    size = t.element_size()
    dims = sorted(((n, st) for n, st in zip(t.shape, t.stride(), strict=True)
                   if n > 1 and st != 0), key=lambda d: d[1])
    if t.numel() == 0:
        return []
    if any(st < 0 for _, st in dims):
        return None
    run, inner = 1, 0  # elements per contiguous run, and how many of the dims it spans
    for n, st in dims:
        if st != run:
            break
        run *= n
        inner += 1
    outer = dims[inner:]
    if math.prod(n for n, _ in outer) > _MAX_RUNS:
        return None
    starts = [t.storage_offset()]
    for n, st in outer:
        starts = [s + i * st for s in starts for i in range(n)]
    return [(s * size, (s + run) * size) for s in starts]


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(runs):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata  # the same for every view of one storage
    except (NotImplementedError, RuntimeError):  # sparse and other storage-less layouts
        return None


def _view_bytes(t: torch.Tensor) -> int:
    """The bytes a view spans without repeats (a broadcast dimension, stride 0, adds none),
    at most its storage's size."""
    elements = math.prod(n for n, st in zip(t.shape, t.stride(), strict=True) if st != 0)
    if t.numel() == 0:
        elements = 0
    return min(elements * t.element_size(), t.untyped_storage().nbytes())


def _distinct(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for t in tensors:
        key = (_storage_key(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _leaf_storages(leaves: dict[str, list[torch.Tensor]]) -> dict[str, dict[int, int]]:
    """Per kind, each storage of its tensors once (key -> bytes it holds); a parameter
    also passed as an input counts under the first kind listed."""
    seen: set[int | None] = {None}  # storage-less layouts (sparse) hold nothing countable
    out: dict[str, dict[int, int]] = {}
    for kind, tensors in leaves.items():
        out[kind] = {}
        for t in tensors:
            key = _storage_key(t)
            if key not in seen:
                seen.add(key)
                out[kind][key] = t.untyped_storage().nbytes()
    return out


def _read_bytes(storages: dict[str, dict[int, int]],
                reads: dict[int, _StorageReads]) -> dict[str, int]:
    """Per kind, the bytes the forward's ops used of its storages."""
    return {kind: sum(reads[key].total() for key in held if key in reads)
            for kind, held in storages.items()}
