"""Attack: reserves disk past its file-size limit with fallocate's KEEP_SIZE (a kernel
that checks RLIMIT_FSIZE only where a file's size grows lets it pass, and the size stays
0, so a poll of sizes sees nothing), and tries io_uring, whose operations run past seccomp; says what each call answered in
its error, so a test can see that the child refused both before any candidate code ran."""

import ctypes
import os
import resource

import torch.nn as nn

_libc = ctypes.CDLL(None, use_errno=True)
_limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
_size = (_limit if _limit != resource.RLIM_INFINITY else 2**30) + 2**20
with open("reserved.bin", "wb") as _f:
    _done = _libc.fallocate(_f.fileno(), 0x01, ctypes.c_long(0), ctypes.c_long(_size))
    _RESERVED = "granted" if _done == 0 else f"errno {ctypes.get_errno()}"
os.remove("reserved.bin")
_done = _libc.syscall(425, 8, ctypes.c_void_p(0))  # io_uring_setup on x86-64 and AArch64
_URING = "granted" if _done >= 0 else f"errno {ctypes.get_errno()}"


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()

    def forward(self, x):
        raise RuntimeError(f"keep-size reservation: {_RESERVED}; io_uring: {_URING}")
