"""Honest: runs its two halves in a thread pool and waits for both before it returns, so
the pool's workers are idle (or finishing) whenever the call has ended."""

from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
import torch.nn.functional as F

_POOL = ThreadPoolExecutor(max_workers=2)


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def _half(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def forward(self, x):
        halves = list(_POOL.map(self._half, torch.chunk(x, 2)))
        return torch.cat(halves)
