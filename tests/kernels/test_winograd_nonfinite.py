"""NaN and infinities through the Winograd convolutions land where the direct convolution puts
them (a tile's transforms mix all its elements: without the direct path on such inputs, one
NaN would make its whole output tile NaN, one infinity its whole tile NaN)."""

import torch
import torch.nn.functional as F

from ollie.kernels.winograd import winograd_conv2d, winograd_conv_transpose2d

SPECIAL = [float("nan"), float("inf"), -float("inf")]


def assert_same_nonfinite(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN at other positions"
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf), "infinities at other positions"
    assert torch.equal(got[inf], want[inf])
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-4, atol=1e-4)


def with_special(x: torch.Tensor, value: float) -> torch.Tensor:
    x = x.clone()
    x[0, 1, 3, 4] = value
    x[-1, 0, 0, 0] = value
    return x


def test_conv2d_with_residual_nonfinite_input() -> None:
    torch.manual_seed(0)  # the shapes of test_winograd's: its transforms, compiled once
    w, b = torch.randn(6, 5, 3, 3), torch.randn(6)
    x, r = torch.randn(1, 5, 10, 10), torch.randn(1, 6, 10, 10)
    conv = winograd_conv2d(w, tuple(x.shape), (1, 1), (1, 1), (1, 1), b, residual=True)
    assert conv is not None
    for value in SPECIAL:
        xs = with_special(x, value)
        assert_same_nonfinite(conv(xs, r), F.conv2d(xs, w, b, 1, 1) + r)
    # a finite input still agrees (the Winograd path)
    torch.testing.assert_close(conv(x, r), F.conv2d(x, w, b, 1, 1) + r, rtol=1e-4, atol=1e-4)


def test_conv_transpose2d_nonfinite_input() -> None:
    torch.manual_seed(1)
    w, b = torch.randn(8, 4, 4, 4), torch.randn(4)
    x = torch.randn(2, 8, 5, 6)
    conv = winograd_conv_transpose2d(w, tuple(x.shape), (2, 2), (1, 1), (0, 0), (1, 1), b)
    assert conv is not None
    for value in SPECIAL:
        xs = with_special(x, value)
        assert_same_nonfinite(conv(xs), F.conv_transpose2d(xs, w, b, 2, 1))
