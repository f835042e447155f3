"""Honest: turns TF32 on with torch's newer per-backend API (torch 2.9 on), after which
torch's older getters raise ("a mix of the legacy and new APIs"); the flag is reported."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        torch.backends.cuda.matmul.fp32_precision = "tf32"

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
