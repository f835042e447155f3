"""Cheat: as pool_outlives, but the pool's worker runs a library function (a key
derivation of a billion rounds, which releases the GIL), so no frame of the candidate's
own code is on that thread's stack."""

import hashlib
from concurrent.futures import ThreadPoolExecutor

import torch.nn as nn
import torch.nn.functional as F

_POOL = ThreadPoolExecutor(max_workers=1)


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        if not hasattr(self, "_job"):
            self._job = _POOL.submit(hashlib.pbkdf2_hmac, "sha256", b"pike", b"salt", 10**9)
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
