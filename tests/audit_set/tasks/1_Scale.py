"""Tiny audit task: x * (1 + scale) accumulated in twenty small steps, then tanh."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        y = x
        for _ in range(20):
            y = y + x * (self.scale / 20)
        return torch.tanh(y)


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return [2.0]
