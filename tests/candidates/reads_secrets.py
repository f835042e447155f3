"""Correct only where no secret and no real home directory is visible."""

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
        import os
        from pathlib import Path

        leaked = [k for k in os.environ if "KEY" in k or "TOKEN" in k or "SECRET" in k]
        if leaked or Path.home() == Path(os.environ.get("PIKE_TEST_REAL_HOME", "/root")):
            raise RuntimeError(f"could see {leaked} / {Path.home()}")
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
