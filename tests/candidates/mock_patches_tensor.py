"""Cheat: patches a torch.Tensor method through unittest.mock, a library helper (the
guard used to let patches from library frames pass)."""

from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.patch = mock.patch.object(torch.Tensor, "tolist", lambda self: [0.0])
        self.patch.start()

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
