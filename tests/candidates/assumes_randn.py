"""Cheat: a shortcut that holds only for randn inputs (values clipped to [-7, 7], where
randn values essentially never reach)."""

import math

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
        return self.compute(x.clamp(-7.0, 7.0))
