"""Common CNN architectures, in the small, for frontend and end-to-end checks.

Each model reproduces the building blocks that give its family its operator mix (written here
from the papers' descriptions, scaled by a base width ``w``), not the published layer counts:

=============  ==========================================================================
mobilenetv2    inverted residuals: 1x1 expand, 3x3 depthwise (stride 2), ReLU6, residual
mobilenetv3    Hardswish, depthwise conv, squeeze-excitation gate with Hardsigmoid
efficientnet   MBConv: SiLU, depthwise conv, squeeze-excitation (GlobalAveragePool, Sigmoid)
squeezenet     fire modules (1x1 squeeze, 1x1 / 3x3 expand, Concat), ceil-mode MaxPool
densenet       dense layers (BN-ReLU-Conv, Concat), transition with AvgPool, 7x7 stem
shufflenetv2   channel split (chunk / Slice), channel shuffle (Reshape-Transpose-Reshape)
vgg            3x3 conv stacks, MaxPool, Flatten and two Linear layers with Dropout
googlenet      inception branches (1x1, 3x3, 5x5, padded MaxPool) joined by Concat
resnext        bottlenecks with grouped 3x3 convolutions
unet           encoder-decoder with ConvTranspose upsampling and a skip Concat
unet_resize    nearest-neighbour interpolation (Resize) instead of ConvTranspose
convnext       patchify stem, 7x7 depthwise conv, LayerNorm and GELU over channels-last
=============  ==========================================================================

:func:`build` returns one in eval mode with seeded random weights and BatchNorm statistics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _cbr(i: int, o: int, k: int = 3, s: int = 1, g: int = 1,
         act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(i, o, k, s, k // 2, groups=g, bias=False),
                         nn.BatchNorm2d(o), act())


class _InvertedResidual(nn.Module):
    def __init__(self, i: int, o: int, s: int, e: int = 4) -> None:
        super().__init__()
        h = i * e
        self.residual = s == 1 and i == o
        self.body = nn.Sequential(_cbr(i, h, 1, act=nn.ReLU6),
                                  _cbr(h, h, 3, s, g=h, act=nn.ReLU6),
                                  nn.Conv2d(h, o, 1, bias=False), nn.BatchNorm2d(o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _cbr(3, w, 3, 2, act=nn.ReLU6), _InvertedResidual(w, w, 1),
            _InvertedResidual(w, w * 3 // 2, 2), _InvertedResidual(w * 3 // 2, w * 3 // 2, 1),
            _cbr(w * 3 // 2, 4 * w, 1, act=nn.ReLU6))
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(4 * w, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class MobileNetV3(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(_cbr(3, w, 3, 2, act=nn.Hardswish),
                                      _cbr(w, w, 3, 1, g=w, act=nn.Hardswish))
        self.out = nn.Conv2d(w, w // 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x)
        return self.out(y * F.hardsigmoid(F.adaptive_avg_pool2d(y, 1)))


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(c, r, 1)
        self.expand = nn.Conv2d(r, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class _MBConv(nn.Module):
    def __init__(self, i: int, o: int, s: int) -> None:
        super().__init__()
        h = 4 * i
        self.body = nn.Sequential(_cbr(i, h, 1, act=nn.SiLU), _cbr(h, h, 3, s, g=h, act=nn.SiLU),
                                  _SqueezeExcite(h, max(1, i // 4)),
                                  nn.Conv2d(h, o, 1, bias=False), nn.BatchNorm2d(o))
        self.residual = s == 1 and i == o

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class EfficientNet(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        o = w * 3 // 2
        self.features = nn.Sequential(_cbr(3, w, 3, 2, act=nn.SiLU), _MBConv(w, w, 1),
                                      _MBConv(w, o, 2), _MBConv(o, o, 1))
        self.head = nn.Linear(o, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class _Fire(nn.Module):
    def __init__(self, i: int, s: int, e: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(i, s, 1)
        self.e1 = nn.Conv2d(s, e, 1)
        self.e3 = nn.Conv2d(s, e, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


class SqueezeNet(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 2 * w, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
            _Fire(2 * w, w // 2, w), _Fire(2 * w, w // 2, w), nn.MaxPool2d(3, 2, ceil_mode=True),
            _Fire(2 * w, w, 2 * w))
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(4 * w, 10, 1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.head(self.features(x)), 1)


class _DenseLayer(nn.Module):
    def __init__(self, i: int, g: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(i), nn.ReLU(), nn.Conv2d(i, 4 * g, 1, bias=False),
            nn.BatchNorm2d(4 * g), nn.ReLU(), nn.Conv2d(4 * g, g, 3, padding=1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


class DenseNet(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        g = w // 2
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1), _DenseLayer(w, g), _DenseLayer(w + g, g),
            nn.BatchNorm2d(w + 2 * g), nn.ReLU(), nn.Conv2d(w + 2 * g, w, 1, bias=False),
            nn.AvgPool2d(2, 2), _DenseLayer(w, g), nn.BatchNorm2d(w + g), nn.ReLU())
        self.head = nn.Linear(w + g, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), (1, 1)), 1))


def _shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous().view(b, c, h, w)


class _ShuffleUnit(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        h = c // 2
        self.body = nn.Sequential(_cbr(h, h, 1), nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False),
                                  nn.BatchNorm2d(h), _cbr(h, h, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return _shuffle(torch.cat([a, self.body(b)], 1), 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        c = w * 3 // 2
        self.features = nn.Sequential(_cbr(3, c, 3, 2), nn.MaxPool2d(3, 2, 1), _ShuffleUnit(c),
                                      _ShuffleUnit(c), _cbr(c, 4 * w, 1))
        self.head = nn.Linear(4 * w, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean([2, 3]))


class VGG(nn.Module):
    def __init__(self, w: int = 16, size: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.ReLU(True), nn.Conv2d(w, w, 3, padding=1),
            nn.ReLU(True), nn.MaxPool2d(2), nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(True),
            nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Linear(2 * w * (size // 4) ** 2, 4 * w), nn.ReLU(True),
                                  nn.Dropout(), nn.Linear(4 * w, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class _Inception(nn.Module):
    def __init__(self, i: int, w: int) -> None:
        super().__init__()
        h = w // 2
        self.b1 = _cbr(i, h, 1)
        self.b2 = nn.Sequential(_cbr(i, h, 1), _cbr(h, w * 3 // 4, 3))
        self.b3 = nn.Sequential(_cbr(i, h // 2, 1), _cbr(h // 2, h, 5))
        self.b4 = _cbr(i, h, 1)
        self.out_channels = 3 * h + w * 3 // 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x),
                          self.b4(F.max_pool2d(x, 3, 1, 1))], 1)


class GoogLeNet(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        a = _Inception(w, w)
        b = _Inception(a.out_channels, w)
        self.features = nn.Sequential(_cbr(3, w, 7, 2), nn.MaxPool2d(3, 2, ceil_mode=True), a, b)
        self.head = nn.Linear(b.out_channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class _ResNeXtBlock(nn.Module):
    def __init__(self, c: int, groups: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_cbr(c, c, 1), _cbr(c, c, 3, g=groups),
                                  nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.body(x))


class ResNeXt(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        c = 2 * w
        self.features = nn.Sequential(_cbr(3, c, 3, 2), _ResNeXtBlock(c, c // 4),
                                      _ResNeXtBlock(c, c // 4))
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class UNet(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        self.enc1 = _cbr(3, w)
        self.enc2 = _cbr(w, 2 * w)
        self.up = nn.ConvTranspose2d(2 * w, w, 2, 2)
        self.dec = _cbr(2 * w, w)
        self.out = nn.Conv2d(w, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.enc1(x)
        b = self.enc2(F.max_pool2d(a, 2))
        return self.out(self.dec(torch.cat([a, self.up(b)], 1)))


class UNetResize(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        self.enc = _cbr(3, w)
        self.dec = _cbr(w, w // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(self.enc(x), 2)
        return self.dec(F.interpolate(y, scale_factor=2, mode="nearest"))


class ConvNeXt(nn.Module):
    def __init__(self, w: int = 16) -> None:
        super().__init__()
        c = 2 * w
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.pw1 = nn.Linear(c, 4 * c)
        self.pw2 = nn.Linear(4 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y)))).permute(0, 3, 1, 2)
        return x + y


ARCHITECTURES: dict[str, type[nn.Module]] = {
    "mobilenetv2": MobileNetV2, "mobilenetv3": MobileNetV3, "efficientnet": EfficientNet,
    "squeezenet": SqueezeNet, "densenet": DenseNet, "shufflenetv2": ShuffleNetV2, "vgg": VGG,
    "googlenet": GoogLeNet, "resnext": ResNeXt, "unet": UNet, "unet_resize": UNetResize,
    "convnext": ConvNeXt,
}


def build(name: str, w: int = 16, size: int = 32, seed: int = 0) -> nn.Module:
    """Architecture ``name`` with base width ``w`` for ``size`` x ``size`` RGB inputs (a
    multiple of 8), in eval mode, with seeded random weights and BatchNorm statistics."""
    if name not in ARCHITECTURES:
        raise KeyError(f"unknown architecture '{name}' (known: {', '.join(ARCHITECTURES)})")
    torch.manual_seed(seed)
    cls = ARCHITECTURES[name]
    model = cls(w, size) if cls is VGG else cls(w)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()
