"""Attack: as iterates_lazily, with a metaclass that names tuple's own methods when the
type's `__iter__` and `__getitem__` are looked up, while its slots run the candidate's
code: the output is computed when the evaluator walks it, after the clock stopped. `ok`
at up to 174x on the CPU before containers with a metaclass of their own were refused
(helper-59)."""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

_debt = 0.0
torch.set_num_threads(1)


class _Liar(type):
    def __getattribute__(cls, name):
        if name in ("__iter__", "__getitem__"):
            return getattr(tuple, name)
        return type.__getattribute__(cls, name)


class _Deferred(tuple, metaclass=_Liar):
    def _value(self):
        global _debt
        if self.done is None:
            t0 = time.perf_counter()
            with torch.no_grad():
                self.done = self.model._honest(self.x)
            _debt += 1.5 * (time.perf_counter() - t0)
        return self.done

    def __iter__(self):
        return iter((self._value(),))

    def __getitem__(self, index):
        return (self._value(),)[index]

    def __len__(self):
        return 1


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def _honest(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def forward(self, x):
        global _debt
        if _debt > 0:
            pay = min(_debt, 2e-3)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < pay:
                pass
            _debt -= pay
        out = _Deferred(())
        out.model, out.x, out.done = self, x, None
        return out
