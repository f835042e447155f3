"""Cheat: raises the audit event for a `gi_frame` read itself (any code may), naming an
object of its own whose `gi_frame` property reads the sealed probes' frame while the hook
looks at that event; serves every timed set from a memo. Refused now: the hook looks only
at real generators, coroutines and tracebacks (it never runs the candidate's code)."""

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


class _Bait:
    """Its `gi_frame` runs while the audit hook looks at the event it was raised for: the
    hook's re-entrancy guard (`looking`) then lets this thread's own events pass."""

    def __init__(self, generator):
        self.generator = generator
        self.frame = None

    @property
    def gi_frame(self):
        self.frame = self.generator.gi_frame  # an evaluator's generator: not seen
        return None


class ModelNew(Base):
    def cheat(self, rotation):
        bait = _Bait(rotation._probes)
        sys.audit("object.__getattr__", bait, "gi_frame")  # any code may raise any event
        if bait.frame is None:
            raise RuntimeError("the hook ran none of the bait's code")
        probes = [s for s in bait.frame.f_locals["probes"] if s is not None]
        if rotation.used_probes == 0:  # not started: a plain iterator, no seal's overhead
            rotation._probes = iter(probes)
        _memo_all(self, list(rotation.sets) + probes)
