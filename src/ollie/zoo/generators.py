"""The small evaluation models: the InfoGAN and DCGAN generators, SRCNN and CSRNet's back end
(MODELS.md). Plain ``nn.Sequential`` stacks, NCHW.

* InfoGAN generator: [b, 228, 1, 1] -> [b, 3, 32, 32]. ConvTranspose2d 228->448 k2 s1 p0, then
  448->256->128->64->3 with k4 s2 p1; ReLU after each layer but the last, Tanh at the end.
* DCGAN generator: [b, 100, 1, 1] -> [b, 3, 64, 64]. ConvTranspose2d 100->512 k4 s1 p0, then
  512->256->128->64->3 with k4 s2 p1; ReLU between, Tanh at the end.
* SRCNN: [b, 1, 224, 224] -> [b, 1, 224, 224]. Conv 1->64 9x9 p4, ReLU, 64->32 5x5 p2, ReLU,
  32->1 5x5 p2.
* CSRNet back end: [b, 512, 14, 14] -> [b, 64, 14, 14]. Six 3x3 convolutions, dilation 2,
  padding 2, no bias, each followed by ReLU: 512->512 x3, 512->256, 256->128, 128->64.

The generators' transposed convolutions have no bias (as in the reference DCGAN generator,
whose layers are followed by BatchNorm in training; MODELS.md lists no normalisation, so none
is built here). SRCNN's convolutions have biases.
"""

from __future__ import annotations

from itertools import pairwise

from torch import nn


def _deconv_stack(channels: list[int], first_kernel: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (cin, cout) in enumerate(pairwise(channels)):
        if i == 0:
            layers.append(nn.ConvTranspose2d(cin, cout, first_kernel, 1, 0, bias=False))
        else:
            layers.append(nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False))
        last = i == len(channels) - 2
        layers.append(nn.Tanh() if last else nn.ReLU())
    return nn.Sequential(*layers)


class InfoGANGenerator(nn.Sequential):
    """InfoGAN generator: [b, 228, 1, 1] -> [b, 3, 32, 32]."""

    def __init__(self) -> None:
        super().__init__(*_deconv_stack([228, 448, 256, 128, 64, 3], first_kernel=2))


class DCGANGenerator(nn.Sequential):
    """DCGAN generator: [b, 100, 1, 1] -> [b, 3, 64, 64]."""

    def __init__(self) -> None:
        super().__init__(*_deconv_stack([100, 512, 256, 128, 64, 3], first_kernel=4))


class SRCNN(nn.Sequential):
    """SRCNN: [b, 1, 224, 224] -> [b, 1, 224, 224]."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(1, 64, 9, padding=4), nn.ReLU(),
            nn.Conv2d(64, 32, 5, padding=2), nn.ReLU(),
            nn.Conv2d(32, 1, 5, padding=2),
        )


class CSRNetBackend(nn.Sequential):
    """CSRNet back end: [b, 512, 14, 14] -> [b, 64, 14, 14]."""

    def __init__(self) -> None:
        layers: list[nn.Module] = []
        channels = [512, 512, 512, 512, 256, 128, 64]
        for cin, cout in pairwise(channels):
            layers += [nn.Conv2d(cin, cout, 3, padding=2, dilation=2, bias=False), nn.ReLU()]
        super().__init__(*layers)
