"""Defines no ModelNew and no Model."""

import torch.nn as nn


class Net(nn.Module):
    def forward(self, x):
        return x
