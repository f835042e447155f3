"""Attack: pushes a torch function mode once and never pops it; timed calls return an
empty plain tensor at once, and the mode, which sees the evaluator's own torch calls on
it, computes only the positions the sampler reads (everything, for any other read), the
work paid back a little in later calls so the median stays fast. `ok` at 42x on the CPU
before modes left in force were refused (helper-59)."""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

_pending = WeakIdKeyDictionary()  # output tensor (or its detach()) -> (model, input)
_debt = 0.0
_META = {"numel", "dim", "size", "stride", "is_complex", "is_floating_point",
         "element_size", "is_contiguous", "data_ptr", "__len__", "__get__"}


def _full(a):
    global _debt
    job = _pending.pop(a, None)
    if job is not None:
        t0 = time.perf_counter()
        a.copy_(job[0]._honest(job[1]))
        _debt += 1.5 * (time.perf_counter() - t0)


class _Fill(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        global _debt
        kwargs = kwargs or {}
        if len(_pending):
            with torch.no_grad():
                a0 = args[0] if args else None
                job = _pending.get(a0) if type(a0) is torch.Tensor else None
                name = getattr(func, "__name__", "")
                if job is not None and (func is torch.Tensor.detach or name in _META):
                    out = func(*args, **kwargs)  # metadata, or an alias still unfilled
                    if type(out) is torch.Tensor:
                        _pending[out] = job
                    return out
                if (job is not None and func is torch.Tensor.__getitem__
                        and isinstance(args[1], tuple) and len(args[1]) == 2):
                    t0 = time.perf_counter()
                    rows, cols = args[1]
                    model, x = job
                    h = F.gelu(model.fc1(x[rows]), approximate="tanh")
                    a0[rows, cols] = (h * model.fc2.weight[cols]).sum(1) + model.fc2.bias[cols]
                    _debt += 1.5 * (time.perf_counter() - t0)
                    return func(*args, **kwargs)
                for a in list(args) + list(kwargs.values()):
                    if type(a) is torch.Tensor:
                        _full(a)
                    elif isinstance(a, (list, tuple)):
                        for b in a:
                            if type(b) is torch.Tensor:
                                _full(b)
        return func(*args, **kwargs)


_mode = None
torch.set_num_threads(1)


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def _honest(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def forward(self, x):
        global _mode, _debt
        if _mode is None:
            _mode = _Fill()
            _mode.__enter__()  # never left
        if _debt > 0:  # pay deferred work back in a few timed calls: the median stays fast
            pay = min(_debt, 2e-3)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < pay:
                pass
            _debt -= pay
        out = torch.empty(x.shape[0], self.fc2.out_features, dtype=x.dtype)
        _pending[out] = (self, x)
        return out
