"""Matches no task of the audit set."""

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x
