"""Tiny audit task: the sum of each row, written as a matrix product."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x @ torch.ones(x.shape[1], 1)


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
