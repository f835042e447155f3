"""Wrong: the kernel only writes the first half of its output."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cuda = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void gelu_tanh_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n / 2) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor gelu_tanh(torch::Tensor x) {
    auto in = x.contiguous();
    auto out = torch::empty_like(in);
    int64_t n = in.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    gelu_tanh_kernel<<<blocks, threads>>>(in.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
_ext = load_inline(name="pike_test_cuda_half", cpp_sources="torch::Tensor gelu_tanh(torch::Tensor x);",
                   cuda_sources=_cuda, functions=["gelu_tanh"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(_ext.gelu_tanh(self.fc1(x)))
