"""GCN, the global convolutional network for semantic segmentation (Peng et al., "Large Kernel
Matters", 2017), on a ResNet-50 backbone. [b, 3, 224, 224] -> [b, 21, 224, 224].

Structure (the paper's Figure 2, compact):

* backbone: ResNet-50 (``ResNet50Backbone``), features of res2..res5 at strides 4, 8, 16, 32
  (256, 512, 1024, 2048 channels; 56, 28, 14, 7 pixels for a 224 input);
* on each of the four feature maps, a GCN block (``GCNBlock``): two branches, ``k x 1`` then
  ``1 x k`` and ``1 x k`` then ``k x 1``, summed, mapping the features to 21 class score maps,
  with no non-linearity (as in the paper); ``k = 7`` everywhere (MODELS.md; the original uses
  ``k = 15`` and the authors' variant also 11 / 15), "same" padding ``k // 2``;
* each GCN output is refined by a boundary-refinement block (``BoundaryRefine``:
  ``x + conv3x3(relu(conv3x3(x)))``, 21 channels);
* top-down: the coarser score map is upsampled x2 by a 21 -> 21 transposed convolution
  (k4 s2 p1), added to the next finer one and refined by another BR block (res5 -> res4 ->
  res3 -> res2); the stride-4 result is upsampled twice more (x2 deconv + BR each) to the input
  resolution.

Choices made to keep it compact and faithful: the GCN blocks output the 21 classes directly
(the paper's setting; the authors' evaluation variant uses 85 / 128 intermediate channels,
which are not reproduced); the deconvolutions are learned transposed convolutions (random,
calibrated), not fixed bilinear kernels. Counts: 53 backbone convolutions (+ 53 BatchNorms),
16 GCN convolutions, 18 BR convolutions, 5 transposed convolutions.
"""

from __future__ import annotations

import torch
from torch import nn

from ollie.zoo.resnet import ResNet50Backbone


class GCNBlock(nn.Module):
    """Global convolution: ``conv_kx1 -> conv_1xk`` plus ``conv_1xk -> conv_kx1``."""

    def __init__(self, cin: int, cout: int, k: int = 7) -> None:
        super().__init__()
        p = k // 2
        self.left1 = nn.Conv2d(cin, cout, (k, 1), padding=(p, 0))
        self.left2 = nn.Conv2d(cout, cout, (1, k), padding=(0, p))
        self.right1 = nn.Conv2d(cin, cout, (1, k), padding=(0, p))
        self.right2 = nn.Conv2d(cout, cout, (k, 1), padding=(p, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left2(self.left1(x)) + self.right2(self.right1(x))


class BoundaryRefine(nn.Module):
    """Boundary refinement: ``x + conv3x3(relu(conv3x3(x)))``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.relu(self.conv1(x)))


def _up(channels: int) -> nn.ConvTranspose2d:
    return nn.ConvTranspose2d(channels, channels, 4, stride=2, padding=1)


class GCN(nn.Module):
    """Global convolutional network: [b, 3, H, W] -> [b, classes, H, W] (H, W multiples of
    32)."""

    def __init__(self, num_classes: int = 21, k: int = 7) -> None:
        super().__init__()
        self.backbone = ResNet50Backbone()
        chans = (256, 512, 1024, 2048)
        self.gcn = nn.ModuleList(GCNBlock(c, num_classes, k) for c in chans)
        self.br = nn.ModuleList(BoundaryRefine(num_classes) for _ in chans)
        self.br_merge = nn.ModuleList(BoundaryRefine(num_classes) for _ in range(3))
        self.up = nn.ModuleList(_up(num_classes) for _ in range(3))
        self.up_final = nn.ModuleList(_up(num_classes) for _ in range(2))
        self.br_final = nn.ModuleList(BoundaryRefine(num_classes) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x)
        scores = [br(gcn(f)) for f, gcn, br in zip(feats, self.gcn, self.br, strict=True)]
        y = scores[3]
        for level in (2, 1, 0):  # res5 -> res4 -> res3 -> res2
            y = self.br_merge[level](scores[level] + self.up[level](y))
        for up, br in zip(self.up_final, self.br_final, strict=True):
            y = br(up(y))
        return y
