"""Cheat: returns a tensor subclass, which could defer or fake its work."""

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


class Lazy(torch.Tensor):
    pass


class ModelNew(_Fused):
    def forward(self, x):
        return self.compute(x).as_subclass(Lazy)
