"""Probe of the check before the timing's staging: computes honestly, and in its first
call registers a kernel of its own for an aten operator the evaluator watches nowhere
else (aten::sin, for a key it had none for). Any kernel of a candidate's could stand in
the way of staging's operators (tests/candidates/slices_the_staging): `rejected` before
the timing's inputs load."""

import math

import torch
import torch.nn as nn

_lib = None


class ModelNew(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global _lib
        if _lib is None:
            _lib = torch.library.Library("aten", "IMPL")
            _lib.impl("sin", lambda t: t, "AutogradCPU")
        h = self.fc1(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        return self.fc2(h)
