"""Attack: writes a file outside its own folders (path from PIKE_TEST_TARGET)."""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class _Fused(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def compute(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

target = os.environ.get("PIKE_TEST_TARGET", os.path.expanduser("~/pike-test-written"))
with open(target, "w") as f:
    f.write("written by a candidate")


class ModelNew(_Fused):
    def forward(self, x):
        return self.compute(x)
