"""Correct, but leaves a process running (even one that escapes the process group)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        import subprocess

        if not hasattr(self, "started"):
            self.started = True
            subprocess.Popen(["sleep", "300"], start_new_session=True)
            subprocess.Popen(["sleep", "300"])
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
