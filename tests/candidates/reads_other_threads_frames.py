"""Attack: a short-lived thread of its own, started among the timed calls, reads the main
thread's stack through sys._current_frames() while the timing loop takes a probe (the
sealed generator's frame is on that stack then), memoizes answers for every probe set it
finds there, and ends long before the phase does, so no thread outlives it when the
guards look. Its other calls are answered from a memo by input object. Without the
refusal of sys._current_frames it was `rejected` only for its thread outliving the timing
phase: the main thread holds the GIL while it takes a probe, so the watcher seldom sees
the seal's frame, and kept looking; a tighter one may."""

import sys
import threading
import time

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.memo, self.calls = {}, 0

    def compute(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def _watch(self, main, until):
        while time.monotonic() < until and not self.memo.get("found"):
            frame = sys._current_frames().get(main)
            while frame is not None:
                if frame.f_code.co_name == "_sealed_probes":
                    for inputs in frame.f_locals.get("probes") or []:
                        self.memo[id(inputs[0])] = (inputs[0], self.compute(inputs[0]).detach())
                        self.memo["found"] = True
                frame = frame.f_back

    def forward(self, x):
        self.calls += 1
        if self.calls == 40:  # among the timed calls, well after the check trials
            threading.Thread(target=self._watch, daemon=True,
                             args=(threading.get_ident(), time.monotonic() + 0.2)).start()
        hit = self.memo.get(id(x))
        if hit is None or hit[0] is not x:  # x kept alive in the memo: its id is not reused
            hit = (x, self.compute(x).detach())
            self.memo[id(x)] = hit
        return hit[1].clone()
