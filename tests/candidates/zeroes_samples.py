"""Attack: walks up the stack into the timer's frame and sets the samples of the calls
before its own to 0 ms, so each block's last sample stays true and the median is 0."""

import sys

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
        frame = sys._getframe(0)
        while frame is not None:
            samples = frame.f_locals.get("samples")
            if isinstance(samples, list):
                samples[:] = [0.0] * len(samples)
            frame = frame.f_back
        return out
