"""ResNet-18 and the ResNet-50 backbone, written out (no torchvision), with torchvision's
module names so that its state dicts would load.

* ``ResNet18``: conv1 7x7/2 + BN + ReLU, max-pool 3x3/2, four stages of two BasicBlocks
  (64, 128, 256, 512 channels; strides 1, 2, 2, 2; 1x1 conv + BN shortcuts where the shape
  changes), global average pool, fc 512 -> 1000. [b, 3, 224, 224] -> [b, 1000].
* ``ResNet50Backbone``: the same stem and four stages of Bottleneck blocks (3, 4, 6, 3; width
  64..512, expansion 4, stride on the 3x3 conv as in torchvision's v1.5), returning the
  features of the four stages: [b, 256, 56, 56], [b, 512, 28, 28], [b, 1024, 14, 14],
  [b, 2048, 7, 7] for a 224 x 224 input.

BatchNorm layers are present in the modules (inference mode); folding them into the
convolutions is the frontends' / optimizer's job.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.bn2.residual_end = True  # calibration hint, see ollie.zoo.init
        self.downsample = _shortcut(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.bn3.residual_end = True  # calibration hint, see ollie.zoo.init
        self.relu = nn.ReLU()
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


def _stage(block: type[BasicBlock | Bottleneck], cin: int, width: int, blocks: int,
           stride: int) -> tuple[nn.Sequential, int]:
    layers = [block(cin, width, stride)]
    cout = width * block.expansion
    layers += [block(cout, width) for _ in range(blocks - 1)]
    return nn.Sequential(*layers), cout


class _ResNetBody(nn.Module):
    def __init__(self, block: type[BasicBlock | Bottleneck], layers: list[int]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        c = 64
        self.layer1, c = _stage(block, c, 64, layers[0], 1)
        self.layer2, c = _stage(block, c, 128, layers[1], 2)
        self.layer3, c = _stage(block, c, 256, layers[2], 2)
        self.layer4, c = _stage(block, c, 512, layers[3], 2)
        self.out_channels = c

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        feats = []
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)
            feats.append(x)
        return feats


class ResNet18(_ResNetBody):
    """torchvision's ResNet-18: [b, 3, 224, 224] -> [b, 1000]."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__(BasicBlock, [2, 2, 2, 2])
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(self.out_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)[-1]
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNet50Backbone(_ResNetBody):
    """ResNet-50 without its head; ``forward`` returns the four stage outputs."""

    def __init__(self) -> None:
        super().__init__(Bottleneck, [3, 4, 6, 3])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.features(x)
