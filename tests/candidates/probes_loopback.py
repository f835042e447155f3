"""Honest: at import, binds a loopback address on port 0 to learn whether IPv6 works, as
urllib3 does when requests or diffusers import it; then computes like `fused`."""

import socket

import torch.nn as nn
import torch.nn.functional as F


def _has(family: int, host: str) -> bool:
    try:
        with socket.socket(family) as sock:
            sock.bind((host, 0))
            return True
    except OSError:  # no such address in this network namespace
        return False


HAS_IPV6 = _has(socket.AF_INET6, "::1")
HAS_IPV4 = _has(socket.AF_INET, "127.0.0.1")


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
