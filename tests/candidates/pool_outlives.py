"""Cheat: keeps the host busy between its calls from a thread pool's worker. The worker's
target is the standard library's (concurrent.futures), so a guard that looks only at a
thread's target does not see it; busy between blocks, it stretches the reference's timing
and widens what the wall-clock check allows."""

from concurrent.futures import ThreadPoolExecutor

import torch.nn as nn
import torch.nn.functional as F

_POOL = ThreadPoolExecutor(max_workers=1)


def _busy():
    total = 0
    while True:
        total += 1


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        if not hasattr(self, "_job"):
            self._job = _POOL.submit(_busy)
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
