"""Cheat: in its calls, looks for the timed input sets' files (the rotated ones and the
probes) to read the sets of later calls ahead and answer them from work done earlier.
Correct otherwise; the test asks whether any was there to read during a call."""

import os

import torch.nn as nn
import torch.nn.functional as F


def _timed_sets_found():
    found = []
    for root in {os.path.dirname(os.getcwd()), "/pike", os.environ.get("TMPDIR", "/tmp")}:
        for folder, _, files in os.walk(root):
            found += [f for f in files if f.startswith("pool_")]
    return found


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        found = _timed_sets_found()
        if found:
            raise RuntimeError(f"could read the timed sets ahead: {sorted(set(found))[:5]}")
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
