"""Correct, but starts a grandchild in a new session, with an empty environment, that
outlives it (a double fork: it is no longer the child's descendant)."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        import os

        if not hasattr(self, "started"):
            self.started = True
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execve("/bin/sleep", ["sleep", "303"], {})
                os._exit(0)
            os.wait()
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
