"""One Longformer attention layer with dilated sliding-window attention (MODELS.md).

Input [b, seq, 512] (hidden 512, 8 heads x 64), output [b, seq, 512]::

    q, k, v = Linear(512, 512)(x) for each               # [b, seq, 512]
    q -> [b, seq, 8, 64] -> [b, 8, seq, 64] -> [b*8, seq, 64]   (same for k, v)
    scores = G2BMM(q, k, width w, dilation d)             # [b*8, seq, 2w+1]
    probs = softmax(scores, -1)
    out = GBMM(probs, v, w, d)                            # [b*8, seq, 64]
    out -> [b, 8, seq, 64] -> [b, seq, 8, 64] -> [b, seq, 512]
    y = relu(Linear(512, 512)(out)); y = relu(Linear(512, 512)(y))
    return y + x                                          # residual

G2BMM / GBMM are the ``torch.ops.ollie`` custom operators of :mod:`ollie.zoo.ops`, single
nodes for ``torch.export`` and the ONNX export. The evaluation configuration is seq 10000,
w = 1000, d = 4; ``seq``, ``width`` and ``dilation`` are options for smaller tests. The
scores are not scaled by 1/sqrt(64) (MODELS.md has no scaling).
"""

from __future__ import annotations

import torch
from torch import nn

from ollie.zoo.ops import g2bmm, gbmm


class LongformerLayer(nn.Module):
    def __init__(self, width: int = 1000, dilation: int = 4, hidden: int = 512,
                 heads: int = 8) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.width, self.dilation, self.heads = width, dilation, heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.ffn1 = nn.Linear(hidden, hidden)
        self.ffn2 = nn.Linear(hidden, hidden)
        self.relu = nn.ReLU()

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, n, h = t.shape
        t = t.reshape(b, n, self.heads, h // self.heads).permute(0, 2, 1, 3)
        return t.reshape(b * self.heads, n, h // self.heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = (self._split(lin(x)) for lin in (self.query, self.key, self.value))
        scores = g2bmm(q, k, self.width, self.dilation)
        probs = torch.softmax(scores, dim=-1)
        out = gbmm(probs, v, self.width, self.dilation)
        out = out.reshape(b, self.heads, n, h // self.heads).permute(0, 2, 1, 3)
        out = out.reshape(b, n, h)
        y = self.relu(self.ffn1(out))
        y = self.relu(self.ffn2(y))
        return y + x
