"""A ViT encoder block written with ``nn.MultiheadAttention``, the module torchvision's
ViT-B/16 uses (``torchvision.models.vision_transformer.EncoderBlock``), for frontend tests and
``tools/graph_ops.py`` (torchvision is not installed)."""

from __future__ import annotations

import torch
from torch import nn


class ViTBlock(nn.Module):
    """Pre-norm encoder block: ``x + MHA(LN(x))``, then ``y + MLP(LN(y))`` (GELU)."""

    def __init__(self, dim: int = 768, heads: int = 12, mlp: int = 3072) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        y = y + x
        return y + self.mlp(self.ln_2(y))
