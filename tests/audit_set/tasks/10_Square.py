"""Tiny audit task: elementwise square, written as a power."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.pow(x, 2.0)


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
