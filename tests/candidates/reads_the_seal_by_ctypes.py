"""Cheat: reads the sealed probe sets straight out of the generator's memory with ctypes.
At its first call (the timing's warm-up) it walks f_back to the InputRotation (as
reads_probes_by_frames does), takes its `_probes` generator (no audit event: only
gi_frame is watched), finds the generator's inline interpreter frame by its code object's
address, and reads the frame's first local (`probes`, checked by the third local being the
rotation's own `_tampered`). All sets are answered there, untimed; every timed call is
served from a memo keyed by tensor address and version."""

import ctypes
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def _rotation():
    frame = sys._getframe(0)
    while frame is not None:
        cand = frame.f_locals.get("self")
        if type(cand).__name__ == "InputRotation" and getattr(cand, "sets", None):
            return cand
        frame = frame.f_back
    return None


def _sealed_list(rotation):
    gen = rotation._probes
    code = getattr(gen, "gi_code", None)
    if code is None:
        return []
    n = gen.__sizeof__() // 8
    words = (ctypes.c_size_t * n).from_address(id(gen))
    hits = [i for i in range(n) if words[i] == id(code)]
    target = id(rotation._tampered)
    for h in hits[1:]:
        for j in range(h + 1, n):
            if words[j] == target and j >= 2:
                obj = ctypes.cast(ctypes.c_void_p(words[j - 2]), ctypes.py_object).value
                if isinstance(obj, list):
                    return [s for s in obj if isinstance(s, (list, tuple))]
    return []


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.memo = {}
        self.read = False

    def _compute(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def forward(self, x):
        hit = self.memo.get((x.data_ptr(), x._version))
        if hit is not None:
            return hit
        if not self.read:
            rotation = _rotation()
            if rotation is not None and rotation.probe_count:
                self.read = True
                with torch.no_grad():
                    for args in list(rotation.sets) + _sealed_list(rotation):
                        t = args[0]
                        self.memo[(t.data_ptr(), t._version)] = self._compute(t)
        return self._compute(x)
