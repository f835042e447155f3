"""Cheat: runs a thread whose code it compiled under a library's file name, so a guard that
trusts code by where it says it lies takes the thread for the standard library's."""

import threading

import torch.nn as nn
import torch.nn.functional as F

_SPIN = compile("import time\ndef spin():\n    while True:\n        time.sleep(0.01)\n",
                "/usr/lib/python3.11/_spin_helper.py", "exec")


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        if not hasattr(self, "worker"):
            space = {}
            exec(_SPIN, space)
            self.worker = threading.Thread(target=space["spin"], daemon=True)
            self.worker.start()
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
