"""Attack: reads its file-size limit as it is imported and tries to raise it; says both in
its error, so a test can see what the child had set before any candidate code ran."""

import resource

import torch.nn as nn

_SOFT, _HARD = resource.getrlimit(resource.RLIMIT_FSIZE)
try:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    _RAISED = "raised"
except (ValueError, OSError) as err:
    _RAISED = f"refused ({type(err).__name__})"


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()

    def forward(self, x):
        raise RuntimeError(f"file limit {_SOFT} {_HARD}; raising it: {_RAISED}")
