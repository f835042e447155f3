"""Cheat: in its constructor, reads every input file it can find near its own folder
(the trials', the timed sets') to precompute answers. Correct otherwise; the test asks
whether any input besides the init inputs was there to read."""

import os

import torch.nn as nn
import torch.nn.functional as F


def _found_inputs():
    found = []
    for root in {os.path.dirname(os.getcwd()), "/pike", os.environ.get("TMPDIR", "/tmp")}:
        for folder, _, files in os.walk(root):
            found += [f for f in files if f.startswith(("inputs_", "pool_"))]
    return found


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.found = _found_inputs()

    def forward(self, x):
        if self.found:
            raise RuntimeError(f"could read ahead: {sorted(set(self.found))[:5]}")
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
