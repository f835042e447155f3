"""Cheat: walks `f_back` from its own frame to see whether the evaluator's timing loop
called it, and then returns a buffer it never computed."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        frame = sys._getframe(0)
        while frame is not None:
            if frame.f_code.co_name in ("_time_host", "_time_cuda"):
                return torch.empty(x.shape[0], self.fc2.out_features, device=x.device)
            frame = frame.f_back
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
