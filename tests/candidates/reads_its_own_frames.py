"""Honest: reads frames of its own the way libraries do (a caught exception's traceback,
its own generator's frame) and computes its outputs; reading a frame is no violation
where the frame is not the evaluator's."""

import torch.nn as nn
import torch.nn.functional as F


def _steps():
    yield "fc1"
    yield "fc2"


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        try:
            raise ValueError("looked at, then handled")
        except ValueError as exc:
            assert exc.__traceback__.tb_frame.f_code.co_name == "forward"
        steps = _steps()
        next(steps)
        assert steps.gi_frame.f_code.co_name == "_steps"
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
