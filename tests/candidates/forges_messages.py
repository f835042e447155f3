"""Attack: writes a fake timing answer straight into the evaluator's channel."""

import json
import math
import os
import sys

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


class ModelNew(_Fused):
    def forward(self, x):
        out = self.compute(x)
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 20 and len(sys.argv) > 2:  # well into the timing
            fake = {"event": "timed", "mode": "candidate", "samples": [1e-6] * 50, "seq": "0"}
            os.write(int(sys.argv[2]), (json.dumps(fake) + "\n").encode())
        return out
