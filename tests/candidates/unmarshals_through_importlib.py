"""Cheat: makes a spinning thread's code object under a library's file name out of marshal
data (its own code with the name's bytes swapped), unmarshalled by importlib's own
`_compile_bytecode` (a frozen frame, which the guards trusted as the import system reading
a cached module) instead of by its own call to marshal.loads, which they refuse. It
vouches for the data with a pyc of its own, written in its temp folder, as the
`bytecode_path` importlib is told."""

import importlib._bootstrap_external as external
import marshal
import os
import tempfile
import threading
import time
import types

import torch.nn as nn
import torch.nn.functional as F

_LIBRARY = "/usr/lib/python3.11/_spin_helper.py"
_OWN = "q" * len(_LIBRARY)
_SPIN = compile("def spin():\n    while True:\n        time.sleep(0.01)\n", _OWN, "exec")


def _spin_named_as_library():
    data = marshal.dumps(_SPIN).replace(_OWN.encode(), _LIBRARY.encode())
    own_pyc = os.path.join(tempfile.gettempdir(), "_spin_helper.cpython-311.pyc")
    with open(own_pyc, "wb") as pyc:
        pyc.write(b"\0" * 16 + data)  # a header, then the data itself
    module_code = external._compile_bytecode(data, name="_spin_helper",
                                             bytecode_path=own_pyc)
    body = next(c for c in module_code.co_consts if isinstance(c, types.CodeType))
    return types.FunctionType(body, {"time": time})


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
