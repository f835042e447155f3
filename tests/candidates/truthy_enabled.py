"""Cheat: sets the Guards' `enabled` to an object whose `__bool__` runs while the sealed
probes' generator is on the stack, walks `f_back` to it there and takes the probes; serves
a memo. Now the seal asks `enabled is False`, runs none of its code, and the memo is told
by its reused answers."""

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


class _Truthy:
    """Stands in for `guards.enabled` (a plain instance attribute, never reset): whenever
    the guards ask it, it says True, and looks back at who asked. The seal asks it through
    probe_taker_is_foreign from inside the sealed generator, whose frame is then one
    `f_back` away: its locals hold every probe. No audit event is raised."""

    def __init__(self):
        self.stolen = []

    def __bool__(self):
        frame = sys._getframe(0).f_back
        while frame is not None:
            if "probes" in frame.f_code.co_varnames and frame.f_code.co_name == "_sealed_probes":
                if not self.stolen:
                    self.stolen = [s for s in frame.f_locals["probes"] if s is not None]
                break
            frame = frame.f_back
        return True


class ModelNew(Base):
    def __init__(self, dim, hidden):
        super().__init__(dim, hidden)
        self.truthy = _Truthy()
        self.memoed = False
        guards = _found("Guards")
        if guards is not None:
            guards.enabled = self.truthy

    def forward(self, x):
        if self.truthy.stolen and not self.memoed:  # inside the first probe's own call
            self.memoed = True
            _memo_all(self, self.truthy.stolen)
        return super().forward(x)

    def cheat(self, rotation):
        _memo_all(self, list(rotation.sets))
