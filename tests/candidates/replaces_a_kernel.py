"""Attack: registers a kernel of its own for aten::index.Tensor on the CPU through
torch.library, which the sampler runs on every timed output it reads: a kernel there
could compute only the positions read, past the clock. This one answers wrongly, so it
shows the kernel was reached; before 2026-12-06 nothing refused the registration (the
sampled values came back wrong: `incorrect`, where a careful kernel gets `ok`)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

_lib = torch.library.Library("aten", "IMPL")


def _index(self, indices):
    return self.flatten()[:1].expand(indices[0].shape[0]).clone()


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self._calls = 0

    def forward(self, x):
        self._calls += 1
        if self._calls == 8:  # past the check trials: only the timed calls see it
            _lib.impl("index.Tensor", _index, "CPU")
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
