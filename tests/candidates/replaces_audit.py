"""Cheat: replaces the Guards' `_audit` on its instance (reached by walking `f_back`), so
the hook decides nothing, then reads the sealed probes and serves a memo. Refused now:
the hook calls the class's function, taken when it was installed."""

import sys
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F


def _found(kind):
    frame = sys._getframe(0)
    while frame is not None:
        for value in frame.f_locals.values():
            if type(value).__name__ == kind:
                return value
        frame = frame.f_back
    return None


def _memo_all(model, sets):
    with torch.no_grad():
        for args in sets:
            t = args[0] if args else None
            if isinstance(t, torch.Tensor):
                model.memo.setdefault((t.data_ptr(), t._version), model._compute(t))


class Base(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.memo = {}
        self.done = False

    def _compute(self, x):
        out = None
        for _ in range(20):  # the honest work, made slow so the memo pays off
            out = self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
        return out

    def forward(self, x):
        key = (x.data_ptr(), x._version)
        if key in self.memo:
            return self.memo[key].clone()
        rotation = _found("InputRotation")
        if rotation is not None and rotation.sets and not self.done:
            self.done = True
            self.cheat(rotation)
        return self._compute(x)


class ModelNew(Base):
    def cheat(self, rotation):
        guards = _found("Guards")
        guards._audit = lambda *a, **k: None  # the hook looks it up on the instance each event
        frame = rotation._probes.gi_frame
        probes = [s for s in frame.f_locals["probes"] if s is not None]
        _memo_all(self, list(rotation.sets) + probes)
