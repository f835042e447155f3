"""Multi-head causal self-attention written as matmul -> mask -> softmax -> matmul."""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, embed, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.tril(torch.ones(t, t, device=x.device)).view(1, 1, t, t)
        scores = scores.masked_fill(mask == 0, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


batch, seq, embed, heads = 4, 512, 256, 8


def get_inputs():
    return [torch.randn(batch, seq, embed)]


def get_init_inputs():
    return [embed, heads]
