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

With ``ops="custom"`` (the default) G2BMM / GBMM are the ``torch.ops.ollie`` custom operators
of :mod:`ollie.zoo.ops`, single nodes for ``torch.export`` and the ONNX export. With
``ops="torch"`` both are written in plain PyTorch (:func:`g2bmm_torch`, :func:`gbmm_torch`):
zero padding, a dilated ``unfold`` (every ``d``-th position of a window of ``2wd+1``) that
gathers the band, a broadcast product and a sum, which the frontend imports as ordinary
operators; eager PyTorch materialises the ``[b*8, seq, 64, 2w+1]`` window, so this variant is
for small ``seq`` and ``width``. The evaluation configuration is seq 10000,
w = 1000, d = 4; ``seq``, ``width`` and ``dilation`` are options for smaller tests. The
scores are not scaled by 1/sqrt(64) (MODELS.md has no scaling).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ollie.zoo.ops import g2bmm, gbmm

OPS = ("custom", "torch")


def _band_window(x: torch.Tensor, width: int, dilation: int) -> torch.Tensor:
    """``W[b, i, c, j] = x[b, i + dilation*(j - width), c]`` (zero outside the sequence)."""
    reach = width * dilation
    padded = F.pad(x, (0, 0, reach, reach))
    return padded.unfold(1, 2 * reach + 1, 1)[..., ::dilation]


def g2bmm_torch(q: torch.Tensor, k: torch.Tensor, width: int, dilation: int = 1
                ) -> torch.Tensor:
    """G2BMM in plain PyTorch: ``S[b, i, j] = Sum_c Q[b, i, c] * K[b, i + d*(j - w), c]``."""
    return (q.unsqueeze(-1) * _band_window(k, width, dilation)).sum(-2)


def gbmm_torch(s: torch.Tensor, v: torch.Tensor, width: int, dilation: int = 1
               ) -> torch.Tensor:
    """GBMM in plain PyTorch: ``O[b, i, n] = Sum_j S[b, i, j] * V[b, i + d*(j - w), n]``."""
    return (s.unsqueeze(-2) * _band_window(v, width, dilation)).sum(-1)


class LongformerLayer(nn.Module):
    def __init__(self, width: int = 1000, dilation: int = 4, hidden: int = 512,
                 heads: int = 8, ops: str = "custom") -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        if ops not in OPS:
            raise ValueError(f"ops must be one of {OPS}, got {ops!r}")
        self.width, self.dilation, self.heads = width, dilation, heads
        self.g2bmm, self.gbmm = (g2bmm, gbmm) if ops == "custom" else (g2bmm_torch, gbmm_torch)
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
        scores = self.g2bmm(q, k, self.width, self.dilation)
        probs = torch.softmax(scores, dim=-1)
        out = self.gbmm(probs, v, self.width, self.dilation)
        out = out.reshape(b, self.heads, n, h // self.heads).permute(0, 2, 1, 3)
        out = out.reshape(b, n, h)
        y = self.relu(self.ffn1(out))
        y = self.relu(self.ffn2(y))
        return y + x
