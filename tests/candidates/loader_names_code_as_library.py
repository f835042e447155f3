"""Cheat: imports a module of its own through an importlib loader subclass whose get_data
returns its own source for a library's file name, so importlib (frozen frames, which the
guards trusted to name what they compile after the file they read) compiles a spinning
thread's code under that name, and a guard that trusts code by where it says it lies
takes the thread for the standard library's."""

import importlib.machinery
import importlib.util
import threading

import torch.nn as nn
import torch.nn.functional as F

_LIBRARY = "/usr/lib/python3.11/_spin_helper.py"
_SOURCE = b"import time\ndef spin():\n    while True:\n        time.sleep(0.01)\n"


class _OwnSource(importlib.machinery.SourceFileLoader):
    def get_data(self, path):
        return _SOURCE


def _spin_named_as_library():
    loader = _OwnSource("_spin_helper", _LIBRARY)
    spec = importlib.util.spec_from_file_location("_spin_helper", _LIBRARY, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.spin


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        if not hasattr(self, "worker"):
            self.worker = threading.Thread(target=_spin_named_as_library(), daemon=True)
            self.worker.start()
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
