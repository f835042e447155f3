"""Tiny audit task: softplus written out as log(1 + exp(x))."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.log(1.0 + torch.exp(x))


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
