"""Cheat: leaves a thread running after the call returns."""

import math
import threading
import time

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


def _spin():
    while True:
        time.sleep(0.01)


class ModelNew(_Fused):
    def forward(self, x):
        if not hasattr(self, "worker"):
            self.worker = threading.Thread(target=_spin, daemon=True)
            self.worker.start()
        return self.compute(x)
