"""Cheat: reaches the timing's input rotation by its module, not by frames, and patches
its class so that no timed call is ever a probe's (a probe's answer is then neither
sampled nor named, and answers reused for the timed sets could pass). `ok` before: a
class attribute set raises no audit event, so the guards' "protected types" never saw
it. Refused now: the integrity snapshot holds the class's attributes one by one."""

import sys

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        timed = sys.modules.get("pike.evaluate.timed_calls")
        if timed is not None and "patched" not in vars(timed.InputRotation):
            timed.InputRotation.last_was_probe = property(lambda self: False)
            timed.InputRotation.patched = True
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
