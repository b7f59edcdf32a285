"""The paper's operator-level cases (MODELS.md, Table 3) lowered and checked against torch at
full size (G2BMM with a shorter sequence), plus the model layers' attribute patterns."""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from lower_testutil import check_op, g2bmm_ref, gbmm_ref, rand, t


def test_conv3x3_resnet18() -> None:
    arrays = {"X": rand((1, 512, 7, 7), 1), "W": rand((512, 512, 3, 3), 2)}
    want = F.conv2d(t(arrays["X"]), t(arrays["W"]), padding=1)
    check_op("Conv2d", arrays, want, rtol=1e-4, atol=5e-4, padding=1)


def test_conv_transpose_infogan() -> None:
    arrays = {"X": rand((16, 448, 2, 2), 3), "W": rand((448, 256, 4, 4), 4)}
    want = F.conv_transpose2d(t(arrays["X"]), t(arrays["W"]), stride=2, padding=1)
    low = check_op("ConvTranspose2d", arrays, want, rtol=1e-4, atol=5e-4, stride=2, padding=1)
    assert low.output_shape == (16, 256, 4, 4)


def test_conv5x5_srcnn_smaller_image() -> None:
    arrays = {"X": rand((2, 32, 40, 40), 5), "W": rand((1, 32, 5, 5), 6)}
    want = F.conv2d(t(arrays["X"]), t(arrays["W"]), padding=2)
    check_op("Conv2d", arrays, want, padding=2)


def test_csrnet_dilated_conv() -> None:
    arrays = {"X": rand((1, 16, 14, 14), 7), "W": rand((8, 16, 3, 3), 8)}
    want = F.conv2d(t(arrays["X"]), t(arrays["W"]), padding=2, dilation=2)
    check_op("Conv2d", arrays, want, padding=2, dilation=2)


@pytest.mark.parametrize("dilation", [1, 4])
def test_longformer_bands(dilation: int) -> None:
    q, k, v = rand((2, 600, 16), 9), rand((2, 600, 16), 10), rand((2, 600, 16), 11)
    scores = g2bmm_ref(t(q), t(k), 50, dilation)
    check_op("G2BMM", {"Q": q, "K": k}, scores, width=50, dilation=dilation)
    s = scores.numpy()
    check_op("GBMM", {"S": s, "V": v}, gbmm_ref(scores, t(v), 50, dilation), rtol=1e-4,
             atol=5e-4, width=50, dilation=dilation)
