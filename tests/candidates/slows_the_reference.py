"""Attack: finds the reference's process (a sibling of the same user, whose command line
names the runner) and renices its threads; correct otherwise. Reports what it found."""

import os

import torch.nn as nn
import torch.nn.functional as F


def _others():
    found, own = [], {os.getpid(), os.getppid(), 1}  # itself and what started it
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in own:
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"pike.evaluate.runner" in cmd:
            try:
                os.setpriority(os.PRIO_PROCESS, int(pid), 19)
                found.append(pid)
            except OSError:
                pass
    return found


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.reniced = _others()

    def forward(self, x):
        if self.reniced:
            raise RuntimeError(f"reniced {self.reniced}")
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
