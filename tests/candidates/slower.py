"""Correct but slower: computes the whole MLP several times over."""

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
        for _ in range(6):
            out = self.fc2(F.gelu(self.fc1(x.clone()), approximate="tanh"))
        return out
