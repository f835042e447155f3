"""Cheat: as r10_profiles_the_seal, but the profile function is installed by no frame of
the candidate's: weakref.finalize(sys.setprofile, hook) on the first check trial's output
runs when the evaluator drops that output (`del out, leaves` in candidate_role), unarmed,
with only the evaluator's and the standard library's frames on the stack."""

import sys
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.memo = {}
        self.armed_once = False

    def _compute(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def _profile(self, frame, event, arg):
        if event != "call" or frame.f_code.co_name != "seal_probes":
            return
        loc = frame.f_locals
        sets = list(getattr(loc.get("self"), "sets", []) or []) + list(loc.get("probes") or [])
        with torch.no_grad():
            for args in sets:
                t = args[0]
                self.memo[(t.data_ptr(), t._version)] = self._compute(t)
        sys.setprofile(None)

    def forward(self, x):
        hit = self.memo.get((x.data_ptr(), x._version))
        if hit is not None:
            return hit
        out = self._compute(x)
        if not self.armed_once:
            self.armed_once = True
            weakref.finalize(out, sys.setprofile, self._profile)
        return out
