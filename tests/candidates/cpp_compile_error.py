"""A C++ extension that does not compile."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_source = """
#include <torch/extension.h>
torch::Tensor twice(torch::Tensor x) { return x * undefined_name; }
"""
_ext = load_inline(name="pike_test_broken", cpp_sources=_source, functions=["twice"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.twice(x)
