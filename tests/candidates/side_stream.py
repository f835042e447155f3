"""Cheat attempt: does its work on a side stream it never joins, so a timer that stops at
the current stream's end event would miss it. Extra sleep makes the hidden work large."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.side = None

    def forward(self, x):
        if self.side is None:
            self.side = torch.cuda.Stream()
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(4_000_000)  # about 2 ms of hidden work
            out = self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
        return out
