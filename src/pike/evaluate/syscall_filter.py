"""A seccomp filter a candidate's child installs on itself before any candidate code runs.

It closes the ways past the disk limit (disk_use.py) that the kernel itself offers, where
no poll of folders sees them:

- `fallocate` with FALLOC_FL_KEEP_SIZE reserves blocks past the file's end without
  growing it. Where a kernel checks RLIMIT_FSIZE only as a file's size grows, that
  passes the limit, and a candidate could reserve the host's disk through one file of the
  shared build cache, which the parent's poll does not count (other candidates write
  there too); this project's CPU host (ext4) answered EFBIG, other kernels were not
  tried. Refused with EOPNOTSUPP, which callers that only meant to pre-allocate take as
  "not supported here"; plain `fallocate` (mode 0, posix_fallocate's) is bounded by
  RLIMIT_FSIZE and stays allowed.
- io_uring: its operations (IORING_OP_FALLOCATE among them) run in the kernel's workers,
  past seccomp. Refused with ENOSYS, as on a kernel without it; nothing torch, Triton or
  the compilers run needs it.
- system calls of another ABI (32-bit `int 0x80`, x32), whose numbers differ and would
  pass the checks above unseen: ENOSYS.

Installed with SECCOMP_FILTER_FLAG_TSYNC, so every thread of the child has it (torch's
import has started some before the candidate's code loads), and inherited by every
process the candidate starts; it cannot be removed. Linux on x86-64 and AArch64 only;
elsewhere `install` says why not, and the verdict's guards say it.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import resource
import struct
import sys

# classic BPF, as seccomp runs it
_LD_W_ABS = 0x20  # A = the 32-bit word at offset k of struct seccomp_data
_JEQ_K, _JGE_K, _JSET_K = 0x15, 0x35, 0x45  # if A == k, A >= k, A & k: jump jt, else jf
_RET_K = 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH = 0, 4
_ARG1_LOW = 16 + 8 + 0  # args[1]'s low word on a little-endian machine (fallocate's mode)
FALLOC_FL_KEEP_SIZE = 0x01
_X32_BIT = 0x40000000

# machine: (AUDIT_ARCH_*, seccomp's own number, fallocate's, io_uring's three)
_ABI = {
    "x86_64": (0xC000003E, 317, 285, (425, 426, 427)),
    "aarch64": (0xC00000B7, 277, 47, (425, 426, 427)),
}
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_PR_SET_NO_NEW_PRIVS = 38


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for `machine` as (code, jt, jf, k) instructions."""
    arch, _, fallocate, io_uring = _ABI[machine]
    # labels resolved after: a jump's offset counts the instructions it skips
    code: list[tuple[int, str | int, str | int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 0, "enosys", arch),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if machine == "x86_64":
        code.append((_JGE_K, "enosys", 0, _X32_BIT))
    code.append((_JEQ_K, "mode", 0, fallocate))
    code += [(_JEQ_K, "enosys", 0, nr) for nr in io_uring]
    code.append((_RET_K, 0, 0, _RET_ALLOW))
    labels = {"mode": len(code)}
    code += [(_LD_W_ABS, 0, 0, _ARG1_LOW), (_JSET_K, "eopnotsupp", 0, FALLOC_FL_KEEP_SIZE),
             (_RET_K, 0, 0, _RET_ALLOW)]
    labels["eopnotsupp"] = len(code)
    code.append((_RET_K, 0, 0, _RET_ERRNO | errno.EOPNOTSUPP))
    labels["enosys"] = len(code)
    code.append((_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS))

    def offset(at: int, to: str | int) -> int:
        return to if isinstance(to, int) else labels[to] - at - 1

    return [(c, offset(i, jt), offset(i, jf), k) for i, (c, jt, jf, k) in enumerate(code)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def unsupported() -> str | None:
    """Why this host gets no filter (None where it does)."""
    if sys.platform.startswith("linux") and platform.machine() in _ABI:
        return None
    return f"no filter for {sys.platform} on {platform.machine()}"


def install() -> str:
    """Installs the filter on this process and its threads: "on", or why it is not."""
    why_not = unsupported()
    if why_not:
        return f"off: {why_not}"
    machine = platform.machine()
    instructions = program(machine)
    raw = b"".join(struct.pack("HBBI", *i) for i in instructions)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    prog = _SockFprog(len(instructions), ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    # without it an unprivileged process may not install a filter (it is inherited
    # across exec, so a setuid program could not be misled by one)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"off: prctl(PR_SET_NO_NEW_PRIVS) failed ({errno.errorcode.get(ctypes.get_errno())})"
    nr_seccomp = _ABI[machine][1]
    done = libc.syscall(ctypes.c_long(nr_seccomp), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                        ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if done != 0:
        err = ctypes.get_errno()
        return (f"off: seccomp() failed ({errno.errorcode.get(err, err)}"
                + (f"; thread {done} could not take it" if done > 0 else "") + ")")
    return "on"


def confine(file_bytes_limit: int) -> str:
    """What every process running candidate code takes on before its code loads: no file
    past `file_bytes_limit` (RLIMIT_FSIZE, hard, so it cannot be raised) and the filter.
    Returns what `install` says."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes_limit, file_bytes_limit))
    return install()
