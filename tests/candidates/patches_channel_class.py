"""Cheat: patches the child's channel class through its module, no frame read, so that
every timed block it reports says half the time it took (the parent's clock bounds such a
claim to its margin; this is about the patch). `ok` before: a class attribute set raises
no audit event. Refused now: the integrity snapshot holds the class's attributes."""

import sys

import torch.nn as nn
import torch.nn.functional as F


def _halved(send):
    def send_halved(self, event, **fields):
        for key, value in fields.items():
            if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
                fields[key] = [v / 2 for v in value]
        return send(self, event, **fields)
    return send_halved


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        protocol = sys.modules.get("pike.evaluate.protocol")
        if protocol is not None and not getattr(protocol.Channel, "halved", False):
            protocol.Channel.send = _halved(protocol.Channel.send)
            protocol.Channel.halved = True
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
