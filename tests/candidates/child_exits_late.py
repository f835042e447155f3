"""Correct; starts a helper process that ends a moment after the evaluation's last call,
as inductor's compile workers do after their pool is shut down. Nothing outlives the
evaluation, so this is not a process left behind."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        import subprocess

        # one always running, so one is still running when the evaluation ends
        helper = getattr(self, "helper", None)
        if helper is None or helper.poll() is not None:
            self.helper = subprocess.Popen(["sleep", "2"])
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
