"""Flat files for the tensors that move between an evaluation's processes.

Trial inputs and outputs are the bulk of an evaluation's traffic: on KernelBench's large
tasks a gigabyte per call. `torch.save` copies each tensor to a fresh host buffer, then
writes it through a zip writer, at about 1 GB/s; `torch.load` reads it back the same way.
This format is a JSON header and the raw bytes of each tensor, 64-byte aligned:

- the writer copies each tensor from the GPU through one pinned buffer into the file (on
  /dev/shm, usually), with no host copy of the whole tensor;
- the reader maps a file it trusts (the reference's), or reads an untrusted one (a
  candidate's) tensor by tensor into its own memory: a mapping of a file the candidate
  can still truncate would end the parent with SIGBUS.

The reader checks every field of the header against the file's size, and the tensors'
total against what the caller expects: a candidate writes its outputs file and may put
anything in it. Lists whose values are not tensors or JSON
scalars (inputs holding other objects) stay with torch.save; `read_leaves` tells the two
apart by the first bytes, so both sides agree without a flag.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MAGIC = b"PIKELEAF"
_HEADER = struct.Struct("<8sQ")  # magic, header length
_ALIGN = 64
_MAX_HEADER = 16 << 20
# Bound at import: the runner imports this before any candidate code runs.
_from_file = torch.from_file
_empty = torch.empty
_Tensor = torch.Tensor
# Only plain dtypes, which every comparison supports (torch.equal and isclose raise on
# bits, sub-byte and quantized types); anything else goes through torch.save.
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex128,
    torch.complex64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
    torch.bool)}
PLAIN_DTYPES = frozenset(_DTYPES.values())
_MAX_DIMS = 64


class LeafFileError(ValueError):
    """A leaves file that cannot be read back as written by the protocol."""


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def writable(leaves: list[Any]) -> bool:
    """Whether `leaves` fit this format (tensors of the usual layout and JSON scalars)."""
    return all((isinstance(v, _Tensor) and v.layout == torch.strided and not v.is_nested
                and v.dtype in PLAIN_DTYPES and v.dim() <= _MAX_DIMS)
               or _scalar(v) for v in leaves)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# Tensors on a GPU cross to the host through one pinned buffer of this size: a copy from
# pinned memory runs at the bus's speed, one from pageable memory at a fraction of it.
STAGE_BYTES = 64 << 20


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    # lazy conjugate and negative views have no bytes of their own until resolved
    return t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


class _Stage:
    """A pinned host buffer, made at first use, for chunks of GPU tensors."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def get(self) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = _empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True)
        return self.buffer


def _write_tensor(f: Any, t: torch.Tensor, stage: _Stage) -> None:
    raw = raw_bytes(t)
    if raw.device.type != "cuda":
        f.write(memoryview(raw.numpy()))
        return
    buffer = stage.get()
    for at in range(0, raw.numel(), STAGE_BYTES):
        n = min(STAGE_BYTES, raw.numel() - at)
        buffer[:n].copy_(raw[at:at + n])  # synchronous: the buffer is written next
        f.write(memoryview(buffer[:n].numpy()))


def layout_of(leaves: list[Any]) -> tuple[list[dict[str, Any]], int]:
    """The header entries of `leaves` (which `writable` accepts) and the bytes their tensors
    take, each at an aligned offset from the start of the data."""
    entries: list[dict[str, Any]] = []
    offset = 0
    for value in leaves:
        if isinstance(value, _Tensor):
            nbytes = value.nbytes
            entries.append({"dtype": str(value.dtype).removeprefix("torch."),
                            "shape": list(value.shape), "offset": offset, "nbytes": nbytes})
            offset = _align(offset + nbytes)
        elif isinstance(value, float) and not math.isfinite(value):
            entries.append({"float": repr(value)})  # JSON has no inf or nan
        else:
            entries.append({"value": value})
    return entries, offset


def write_leaves(leaves: list[Any], path: Path, in_place: bool = False) -> None:
    """Write tensors (on any device) and scalars to `path`; torch.save where the format
    cannot hold them. `in_place`: a file already at `path` is written over, not emptied
    first: its memory pages (on /dev/shm) are reused, which on a gigabyte of outputs saves
    a third of the write. Never for a file someone may have mapped: they would see it
    change."""
    if not writable(leaves):
        torch.save([v.detach().cpu() if isinstance(v, _Tensor) else v for v in leaves], path)
        return
    entries, body = layout_of(leaves)
    header = json.dumps({"leaves": entries}).encode()
    start = _align(_HEADER.size + len(header))
    stage = _Stage()
    flags = os.O_RDWR | os.O_CREAT | (os.O_NOFOLLOW if in_place else os.O_TRUNC)
    with os.fdopen(os.open(path, flags, 0o644), "r+b") as f:
        f.write(_HEADER.pack(MAGIC, len(header)) + header)
        at = _HEADER.size + len(header)
        # the gaps are written too: a file written over keeps no byte of what it held
        for value, entry in zip(leaves, entries, strict=True):
            if isinstance(value, _Tensor) and entry["nbytes"]:
                f.write(bytes(start + entry["offset"] - at))
                _write_tensor(f, value, stage)
                at = start + entry["offset"] + entry["nbytes"]
        f.write(bytes(max(0, start + body - at)))
        f.truncate(start + body)


def read_leaves(path: Path, trusted: bool = False, device: torch.device | None = None,
                max_bytes: int | None = None) -> list[Any]:
    """The leaves in `path`. `trusted` (a file no candidate can change): mapped, so pages
    are read as they are used; otherwise each tensor is read into this process's memory
    or, with a CUDA `device`, through a pinned buffer straight into the device's.
    `max_bytes` bounds what an untrusted file's tensors may take: the file can be sparse,
    its size anything its writer set. An untrusted file is opened once, and only as the
    one name of a regular file (`_open_untrusted`)."""
    if trusted:
        with open(path, "rb") as f:
            flat = f.read(len(MAGIC)) == MAGIC
        leaves = (_read_flat(path, None, True, device, max_bytes) if flat
                  else torch.load(path, weights_only=True, mmap=True))
    else:
        with _open_untrusted(path) as f:
            flat = f.read(len(MAGIC)) == MAGIC
            f.seek(0)
            leaves = (_read_flat(path, f, False, device, max_bytes) if flat
                      else torch.load(f, weights_only=True))
    if not isinstance(leaves, list):
        raise LeafFileError("the file does not hold a list")
    return leaves


def _open_untrusted(path: Path) -> Any:
    """A candidate's file, open for reading, refused unless it is a regular file with no
    other name: its writer could leave a symbolic link or a hard link to a file of this
    process (the reference's outputs, say) or a FIFO that blocks the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LeafFileError("the file is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LeafFileError("not a regular file")
        if st.st_nlink != 1:
            raise LeafFileError("the file has another name (a hard link)")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _header(f: Any, size: int) -> tuple[list[Any], list[Any], int]:
    """The entries, their checked tensor fields and where the data starts."""
    _, length = _HEADER.unpack(f.read(_HEADER.size))
    if length > min(_MAX_HEADER, size - _HEADER.size):
        raise LeafFileError("header length out of range")
    try:
        entries = json.loads(f.read(length))["leaves"]
    except (ValueError, KeyError, TypeError) as err:
        raise LeafFileError(f"unreadable header: {err}") from None
    start = _align(_HEADER.size + length)
    return entries, checked_entries(entries, size - start), start


def checked_entries(entries: Any, body: int) -> list[tuple[torch.dtype, list[int], int, int] | None]:
    """Each entry's tensor fields checked against a body of `body` bytes (None for a
    scalar), written by whoever wrote the leaves: a candidate, maybe."""
    if not isinstance(entries, list):
        raise LeafFileError("header holds no list of leaves")
    tensors = [_checked(e, body) for e in entries]
    # No two tensors may share bytes: a header that names one region many times would make
    # the reader allocate many times its size, and outputs would alias each other.
    end = 0
    for _, _, offset, nbytes in sorted((t for t in tensors if t is not None and t[3]),
                                       key=lambda t: t[2]):
        if offset < end:
            raise LeafFileError("tensors overlap in the file")
        end = offset + nbytes
    return tensors


def _fill(f: Any, into: memoryview) -> None:
    got = 0
    while got < len(into):
        n = f.readinto(into[got:])
        if not n:
            raise LeafFileError("the file shrank while it was read")
        got += n


def _read_tensor(f: Any, nbytes: int, device: torch.device | None, stage: _Stage
                 ) -> torch.Tensor:
    """`nbytes` from the file's position, on `device` (the host by default)."""
    if device is None or device.type != "cuda":
        raw = _empty(nbytes, dtype=torch.uint8)
        _fill(f, memoryview(raw.numpy()))
        return raw
    raw = _empty(nbytes, dtype=torch.uint8, device=device)
    for at in range(0, nbytes, STAGE_BYTES):
        n = min(STAGE_BYTES, nbytes - at)
        chunk = stage.get()[:n]
        _fill(f, memoryview(chunk.numpy()))
        raw[at:at + n].copy_(chunk)  # synchronous: the buffer is refilled next
    return raw


def _read_flat(path: Path, opened: Any, trusted: bool, device: torch.device | None,
               max_bytes: int | None) -> list[Any]:
    """A flat file's leaves, from `opened` where the caller holds it open already."""
    stage = _Stage()
    with opened or open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        entries, tensors, start = _header(f, size)
        wanted = sum(t[3] for t in tensors if t is not None)
        if not trusted and max_bytes is not None and wanted > max_bytes:
            raise LeafFileError(f"its tensors take {wanted} bytes, more than the "
                                f"{max_bytes} expected")
        mapped = (_from_file(str(path), shared=False, size=size, dtype=torch.uint8)
                  if trusted and wanted else None)

        def raw_of(offset: int, nbytes: int) -> torch.Tensor:
            if mapped is not None:
                return mapped[start + offset:start + offset + nbytes]
            f.seek(start + offset)
            return _read_tensor(f, nbytes, device, stage)

        return assemble(entries, tensors, raw_of, device)


def assemble(entries: list[Any], tensors: list[tuple[torch.dtype, list[int], int, int] | None],
             raw_of: Callable[[int, int], torch.Tensor], device: torch.device | None
             ) -> list[Any]:
    """The leaves that checked `entries` describe; `raw_of(offset, nbytes)` gives a
    tensor's bytes (as uint8), from wherever they were written."""
    leaves: list[Any] = []
    for entry, tensor in zip(entries, tensors, strict=True):
        if tensor is None:
            leaves.append(_value(entry))
            continue
        dtype, shape, offset, nbytes = tensor
        if nbytes == 0:
            leaves.append(_empty(shape, dtype=dtype, device=device))
        else:
            leaves.append(raw_of(offset, nbytes).view(dtype).view(shape))
    return leaves


def _checked(entry: Any, body: int) -> tuple[torch.dtype, list[int], int, int] | None:
    """A tensor entry's fields, each checked against the file; None for a scalar."""
    if not isinstance(entry, dict):
        raise LeafFileError("a leaf entry is not an object")
    if "dtype" not in entry:
        return None
    dtype = _DTYPES.get(entry.get("dtype")) if isinstance(entry.get("dtype"), str) else None
    shape, offset, nbytes = entry.get("shape"), entry.get("offset"), entry.get("nbytes")
    if dtype is None:
        raise LeafFileError(f"unknown dtype {entry.get('dtype')!r}")
    if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS
            and all(type(n) is int and n >= 0 for n in shape)):
        raise LeafFileError("bad shape")
    if not (type(offset) is int and type(nbytes) is int and offset >= 0 and nbytes >= 0):
        raise LeafFileError("bad offset or size")
    if math.prod(shape) * dtype.itemsize != nbytes or offset % _ALIGN or offset + nbytes > body:
        raise LeafFileError("a tensor's size or place does not fit the file")
    return dtype, shape, offset, nbytes


def _value(entry: dict[str, Any]) -> Any:
    if "float" in entry:
        text = entry["float"]
        if text not in ("inf", "-inf", "nan"):
            raise LeafFileError("bad float")
        return float(text)
    value = entry.get("value")
    if not _scalar(value):
        raise LeafFileError("a value leaf is not a scalar")
    return value
