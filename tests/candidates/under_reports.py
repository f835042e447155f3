"""Attack: reports 0.6 of each timed call's true time (a 1.7x claim), by walking up the
stack into the timer's frame and scaling the samples it has not scaled yet. Too little to
trip the wall-clock margin; its figure must still be held to the parent's clock."""

import sys

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self._scaled = 0

    def forward(self, x):
        out = self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
        frame = sys._getframe(0)
        while frame is not None:
            samples = frame.f_locals.get("samples")
            if isinstance(samples, list):
                done = self._scaled if self._scaled <= len(samples) else 0  # a new block
                samples[done:] = [s * 0.6 for s in samples[done:]]
                self._scaled = len(samples)
                break
            frame = frame.f_back
        return out
