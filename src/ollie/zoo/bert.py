"""One BERT encoder layer written with plain PyTorch operators (post-norm, as in BERT-base).

Input [b, seq, hidden], output [b, seq, hidden]; defaults hidden 768, 12 heads, FFN 3072::

    q, k, v = Linear(hidden, hidden)(x) for each             # three separate projections
    q -> [b, seq, heads, d] -> [b, heads, seq, d]            (same for k, v; d = hidden/heads)
    probs = softmax(q @ k^T / sqrt(d), -1)                   # [b, heads, seq, seq]
    ctx = probs @ v -> [b, seq, heads, d] -> [b, seq, hidden]
    y = LayerNorm(Linear(hidden, hidden)(ctx) + x)
    return LayerNorm(Linear(ffn, hidden)(gelu(Linear(hidden, ffn)(y))) + y)

There is no attention mask and no dropout (inference). ``LayerNorm`` and ``gelu`` stay
opaque operators in the imported graph; every projection and both attention products are
compute operators.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class BertLayer(nn.Module):
    def __init__(self, hidden: int = 768, heads: int = 12, ffn: int = 3072) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ffn1 = nn.Linear(hidden, ffn)
        self.ffn2 = nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, h = t.shape
        return t.reshape(b, n, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = (self._heads(lin(x)) for lin in (self.query, self.key, self.value))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(h // self.heads)
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, n, h)
        y = self.norm1(self.out(ctx) + x)
        return self.norm2(self.ffn2(F.gelu(self.ffn1(y))) + y)
