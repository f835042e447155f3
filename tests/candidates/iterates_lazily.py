"""Attack: as lazy_when_timed, with a container instead of a tensor subclass: timed calls
return at once a tuple whose type computes the output only when the evaluator walks it,
after the clock stopped. Honest in the check trials and the final check. Each deferred
call waits a little, so that a probe's honest time stays within the reuse check's margin.
"""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
PAD_S = 0.0005


class _Deferred(tuple):
    def __iter__(self):
        return iter((self.compute(),))

    def __getitem__(self, index):
        return (self.compute(),)[index]


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self._seen = {}

    def _compute(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def forward(self, x):
        seen = self._seen.get(id(x))
        if seen is None or seen[0] is not x or seen[1] != x._version:
            self._seen[id(x)] = (x, x._version)
            return self._compute(x)  # first sight: a check trial, or a set's first call
        start = time.perf_counter()
        out = _Deferred(())
        out.compute = lambda: self._compute(x)
        while time.perf_counter() - start < PAD_S:
            pass
        return out
