"""Attack: makes empty files in its own temp folder until something stops it (no bytes to
count, but every file costs an inode and a walk of the folder)."""

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
        folder = tempfile.mkdtemp()
        for n in range(10_000_000):
            open(os.path.join(folder, str(n)), "wb").close()
            if n % 100 == 0:
                time.sleep(0.001)
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
