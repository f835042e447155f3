"""Attack: a thread floods the evaluator's channel with spaces, never a line end, while the
forward never returns. With bytes always waiting, the parent's loop once read on and on
and skipped every limit (no timeout, no memory or disk limit), its buffer growing."""

import os
import sys
import threading
import time

import torch.nn as nn


def _flood(fd):
    chunk = b" " * 65536
    while True:
        os.write(fd, chunk)


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()

    def forward(self, x):
        threading.Thread(target=_flood, args=(int(sys.argv[2]),), daemon=True).start()
        while True:
            time.sleep(0.01)
