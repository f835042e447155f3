"""Attack: replaces the evaluator's clock with one that stands still."""

import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

timing = sys.modules["pike.evaluate.timing"]  # loaded by the runner before the candidate


class _Fused(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def compute(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

timing._perf_counter = lambda: 0.0


class ModelNew(_Fused):
    def forward(self, x):
        return self.compute(x)
