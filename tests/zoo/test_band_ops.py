"""The G2BMM / GBMM custom operators: blocked implementation against the plain loops, fake
(meta) shapes, and one node each under torch.export."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ollie.errors import ShapeError
from ollie.zoo.ops import g2bmm, g2bmm_reference, gbmm, gbmm_reference


@settings(max_examples=25)
@given(b=st.integers(1, 3), m=st.integers(1, 40), k=st.integers(1, 6), w=st.integers(0, 12),
       d=st.integers(1, 5), seed=st.integers(0, 1000))
def test_blocked_matches_reference(b: int, m: int, k: int, w: int, d: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q, kk, v = (torch.randn(b, m, k, generator=g) for _ in range(3))
    s = g2bmm(q, kk, w, d)
    assert s.shape == (b, m, 2 * w + 1)
    torch.testing.assert_close(s, g2bmm_reference(q, kk, w, d), rtol=1e-5, atol=1e-5)
    p = torch.randn(b, m, 2 * w + 1, generator=g)
    torch.testing.assert_close(gbmm(p, v, w, d), gbmm_reference(p, v, w, d), rtol=1e-5,
                               atol=1e-5)


def test_definition_by_hand() -> None:
    q = torch.arange(6.0).reshape(1, 6, 1)
    s = g2bmm(q, q, 1, 2)  # S[i, j] = q[i] * q[i + 2 (j - 1)]
    want = [[q[0, i, 0] * (q[0, i + 2 * (j - 1), 0] if 0 <= i + 2 * (j - 1) < 6 else 0)
             for j in range(3)] for i in range(6)]
    torch.testing.assert_close(s[0], torch.tensor(want))


def test_meta_and_export() -> None:
    q = torch.empty(2, 50, 8, device="meta")
    assert torch.ops.ollie.g2bmm(q, q, 4, 3).shape == (2, 50, 9)
    s = torch.empty(2, 50, 9, device="meta")
    assert torch.ops.ollie.gbmm(s, q, 4, 3).shape == (2, 50, 8)

    class M(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return gbmm(torch.softmax(g2bmm(a, b, 2, 2), -1), b, 2, 2)

    ep = torch.export.export(M(), (torch.randn(1, 10, 4), torch.randn(1, 10, 4)))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "ollie.g2bmm.default" in targets and "ollie.gbmm.default" in targets


def test_shape_errors() -> None:
    with pytest.raises(ShapeError, match="G2BMM"):
        g2bmm(torch.randn(1, 4, 2), torch.randn(1, 5, 2), 1)
    with pytest.raises(ShapeError, match="GBMM"):
        gbmm(torch.randn(1, 4, 4), torch.randn(1, 4, 2), 1)
