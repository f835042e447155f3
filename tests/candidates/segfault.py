"""Crashes with a segmentation fault (faulthandler's own, as a null pointer would)."""

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
        import faulthandler

        faulthandler._sigsegv()
        return x
