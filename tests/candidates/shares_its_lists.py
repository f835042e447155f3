"""Cost, not a forged figure: returns its answer inside 31 levels of lists that share
themselves ([L, L] at each level), a few objects that make 2^31 parts. Every walk of the
output (the plainness check, the leaves' flattening) took 2^31 steps, and the evaluation
ran to its phase's limit. Now rejected at the first check trial: an output may have at
most 10,000 parts."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor):
        out = self.fc2(torch.nn.functional.gelu(self.fc1(x), approximate="tanh"))
        nest = [out, out]
        for _ in range(31):
            nest = [nest, nest]
        return nest
