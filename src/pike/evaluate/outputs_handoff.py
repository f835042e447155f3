"""A candidate's trial outputs handed to the parent in GPU memory instead of a file.

On KernelBench's large tasks a trial's outputs are a gigabyte: the child wrote them through
a pinned buffer into /dev/shm and the parent read them back onto its GPU, about 4 s of a
check phase whose forward passes take 0.2 s (bench/results/eval-overhead-h200-*). Here the
parent allocates one buffer on the evaluation's GPU and gives the child a CUDA IPC handle
to it; the child copies each trial's outputs into it (a millisecond a gigabyte) and says
where each leaf lies, in the entries of a leaves file's header.

What it trusts, and what it does not:
- The buffer is the parent's own allocation, made with the driver (`cuMemAlloc`) outside
  torch's caching allocator, in whole 2 MiB units (a handle lends the whole block the
  driver placed an allocation in), and cleared before it is lent: fresh driver memory
  holds what this process freed there last, such as chunks of expected outputs a
  comparison copied. The child gets a handle to it and to nothing else.
- The child's entries are checked against the buffer's size as a file's header is
  (`leaf_files.checked_entries`), and each trial is copied out into the parent's own
  memory before the child is told it may write the next one: the comparison never reads
  bytes the child can still change.
- The buffer is freed only once its child has ended (CUDA leaves a free of memory another
  process still maps undefined; on an H200 a write after the free did not reach the
  parent's next allocation at the same address, but nothing rests on that).
- Where anything fails (no driver, no memory, outputs larger than the buffer or than
  `_MAX_SHARE` of the card, a dtype the format cannot hold) the trial goes through its
  file as before.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pike.evaluate.leaf_files import (
    LeafFileError,
    assemble,
    checked_entries,
    layout_of,
    raw_bytes,
    writable,
)

log = logging.getLogger(__name__)

_Tensor = torch.Tensor  # bound at import: the runner imports this before candidate code
_HANDLE_BYTES = 64
_MAX_LEAVES = 1 << 16  # a file's header is bounded by its size; the child's message is not
_UNIT = 2 << 20
# A buffer lives as long as its child, timing included: larger outputs go through files
# rather than take this share of the card from the candidates.
_MAX_SHARE = 0.05


class HandoffError(RuntimeError):
    """A CUDA driver call for the handoff failed."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _HANDLE_BYTES)]


_Ptr = ctypes.c_uint64


@functools.cache
def _driver() -> Any:
    """libcuda's IPC and allocation calls, typed (the `_v2` names are today's ABI)."""
    lib = ctypes.CDLL("libcuda.so.1")
    calls = {
        "cuMemAlloc_v2": [ctypes.POINTER(_Ptr), ctypes.c_size_t],
        "cuMemFree_v2": [_Ptr],
        "cuIpcGetMemHandle": [ctypes.POINTER(_Handle), _Ptr],
        "cuIpcOpenMemHandle_v2": [ctypes.POINTER(_Ptr), _Handle, ctypes.c_uint],
        "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    }
    for name, args in calls.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _call(name: str, *args: Any) -> None:
    lib = _driver()
    rc = getattr(lib, name)(*args)
    if rc:
        text = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(text))
        raise HandoffError(f"{name}: {(text.value or b'?').decode()} ({rc})")


class _DeviceBytes:
    """`nbytes` of device memory at `ptr` as torch sees an external array (no ownership)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


def _as_tensor(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    view = torch.as_tensor(_DeviceBytes(ptr, nbytes), device=device)
    if view.data_ptr() != ptr:  # a copy, not the shared bytes (another device's pointer)
        raise HandoffError("the buffer is not on the evaluation's device")
    return view


@contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    """`device`'s primary context (torch's) current on this thread for the driver calls
    inside; a thread's context is another GPU's after torch's own guards restore it."""
    with torch.cuda.device(device):
        torch.cuda.current_stream(device).synchronize()  # a runtime call binds the context
        yield


def _rounded(nbytes: int) -> int:
    # The driver may place a small allocation inside a larger block, and a handle lends
    # the whole block: whole 2 MiB units share nothing else.
    return -(-nbytes // _UNIT) * _UNIT


def write_into(buffer: torch.Tensor, leaves: list[Any], entries: list[dict[str, Any]]) -> None:
    """Each tensor of `leaves` into the bytes `buffer` at its entry's offset."""
    for value, entry in zip(leaves, entries, strict=True):
        if isinstance(value, _Tensor) and entry["nbytes"]:
            at = entry["offset"]
            buffer[at:at + entry["nbytes"]].copy_(raw_bytes(value))


def leaves_from(buffer: torch.Tensor, entries: Any, to: torch.device) -> list[Any]:
    """The leaves `entries` place in the bytes `buffer`, each checked against its size
    and copied onto `to` (LeafFileError where they do not fit)."""
    if isinstance(entries, list) and len(entries) > _MAX_LEAVES:
        raise LeafFileError(f"{len(entries)} leaves, more than {_MAX_LEAVES}")
    tensors = checked_entries(entries, buffer.numel())

    def raw_of(offset: int, nbytes: int) -> torch.Tensor:
        return buffer[offset:offset + nbytes].to(to, copy=True)

    return assemble(entries, tensors, raw_of, to)


class OutputsBuffer:
    """The parent's side: a buffer on the evaluation's GPU, lent to one candidate child."""

    def __init__(self, ptr: int, nbytes: int, on: torch.device) -> None:
        self.ptr, self.nbytes, self.on = ptr, nbytes, on
        self.handed = 0  # trials taken from the buffer, for the log
        self._bytes = _as_tensor(ptr, nbytes, on)
        # Fresh driver memory holds whatever this process freed there last, such as the
        # chunks of expected outputs a comparison copied: cleared before it is lent.
        self._bytes.zero_()
        torch.cuda.current_stream(on).synchronize()
        handle = _Handle()
        _call("cuIpcGetMemHandle", ctypes.byref(handle), _Ptr(ptr))
        self.handle = ctypes.string_at(ctypes.byref(handle), _HANDLE_BYTES).hex()

    @classmethod
    def offer(cls, expected: list[list[Any]], on: torch.device) -> OutputsBuffer | None:
        """A buffer for the largest trial's expected outputs, where `on` is a GPU this
        process uses, the expected outputs fit the format and the buffer `_MAX_SHARE` of
        the card; else None. The caller closes it once the child has ended."""
        if on.type != "cuda" or not expected or not all(writable(t) for t in expected):
            return None
        nbytes = _rounded(max(layout_of(t)[1] for t in expected))
        ptr = _Ptr()
        try:
            with _on_device(on):
                if not 0 < nbytes <= _MAX_SHARE * torch.cuda.get_device_properties(on).total_memory:
                    return None
                _call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
                try:
                    return cls(ptr.value, nbytes, on)
                except Exception:
                    _call("cuMemFree_v2", ptr)
                    raise
        except Exception as err:  # no driver, no memory: the files, as before
            log.info("trial outputs go through files: %s", err)
            return None

    def describe(self) -> dict[str, Any]:
        return {"handle": self.handle, "bytes": self.nbytes}

    def take(self, entries: Any, to: torch.device) -> list[Any]:
        """The leaves the child says it wrote, copied onto `to` before the child may write
        again. Raises LeafFileError where the entries do not fit the buffer."""
        leaves = leaves_from(self._bytes, entries, to)
        torch.cuda.current_stream(self.on).synchronize()  # copied before "taken" is sent
        self.handed += 1
        return leaves

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            del self._bytes
            try:
                with _on_device(self.on):
                    _call("cuMemFree_v2", _Ptr(ptr))
            except Exception as err:  # leaked until this process ends
                log.warning("could not free a trial outputs buffer: %s", err)


class OutputsSlot:
    """The child's side: the parent's buffer, opened, and whether the parent has taken
    the trial last written into it."""

    def __init__(self, ptr: int, nbytes: int, device: torch.device) -> None:
        self.nbytes, self.device = nbytes, device
        self.bytes = _as_tensor(ptr, nbytes, device)
        self.pending: int | None = None  # the trial in the buffer the parent has not taken

    @classmethod
    def open(cls, offer: Any, device: torch.device) -> OutputsSlot | None:
        """The buffer the parent offers (None when it offers none or it cannot be opened:
        the trials then go through files)."""
        if device.type != "cuda" or not isinstance(offer, dict):
            return None
        try:
            raw = bytes.fromhex(str(offer["handle"]))
            nbytes = int(offer["bytes"])
            if len(raw) != _HANDLE_BYTES or nbytes <= 0:
                return None
            handle = _Handle()
            ctypes.memmove(ctypes.byref(handle), raw, _HANDLE_BYTES)
            ptr = _Ptr()
            with _on_device(device):
                # 1: CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, where the child runs on another GPU
                _call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), handle, ctypes.c_uint(1))
            return cls(ptr.value, nbytes, device)
        except Exception:  # anything: the trials then go through files
            return None

    def put(self, leaves: list[Any], trial: int, wait_taken: Callable[[int], None]
            ) -> list[dict[str, Any]] | None:
        """Write trial `trial`'s `leaves` into the buffer once the parent has taken the
        last one (`wait_taken(that trial)`), and return their entries; None where they do
        not fit (the caller writes the file)."""
        if not writable(leaves):
            return None
        entries, body = layout_of(leaves)
        if body > self.nbytes:
            return None
        self.settle(wait_taken)
        write_into(self.bytes, leaves, entries)
        torch.cuda.synchronize(self.device)  # written before the parent hears "saved"
        self.pending = trial
        return entries

    def settle(self, wait_taken: Callable[[int], None]) -> None:
        """Wait until the parent has taken the trial in the buffer, if one is there."""
        if self.pending is not None:
            wait_taken(self.pending)
            self.pending = None
