"""Helpers of the lowering tests: random inputs, evaluation through the interpreter, and the
comparison against a PyTorch (or numpy) reference."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

import ollie
from ollie.lower import Lowered, lower

RTOL = 1e-4
ATOL = 1e-4


def rand(shape: tuple[int, ...], seed: int = 0, positive: bool = False) -> np.ndarray:
    """Standard-normal float32 data (``positive``: in [0.1, 2.1))."""
    rng = np.random.default_rng(seed)
    if positive:
        return (rng.random(shape) * 2 + 0.1).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def evaluate(low: Lowered, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Interpret the lowered expression on ``arrays`` plus its constant tensors."""
    out = np.asarray(ollie.interpret(low.expr, {**arrays, **low.consts}))
    assert out.shape == tuple(low.output_shape), (out.shape, low.output_shape)
    assert low.expr.shape == tuple(low.output_shape)
    return out


def assert_round_trip(low: Lowered) -> None:
    """The printed expression parses back to the same expression."""
    assert ollie.parse(ollie.format(low.expr)) == low.expr


def check_op(kind: str, arrays: Mapping[str, np.ndarray], expected: object,
             rtol: float = RTOL, atol: float = ATOL, **attrs: object) -> Lowered:
    """Lower ``kind`` on ``arrays`` (in order), interpret, compare with ``expected``."""
    low = lower(kind, [(name, a.shape) for name, a in arrays.items()], **attrs)
    assert dict(low.expr.decls) == {**{n: a.shape for n, a in arrays.items()},
                                     **{n: c.shape for n, c in low.consts.items()}}
    assert_round_trip(low)
    got = evaluate(low, arrays)
    want = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return low


def g2bmm_ref(q: torch.Tensor, k: torch.Tensor, w: int, d: int) -> torch.Tensor:
    """S[b, i, j] = sum_k Q[b, i, k] K[b, i + d (j - w), k], zero outside the sequence."""
    seq = q.shape[1]
    kp = F.pad(k, (0, 0, d * w, d * w))  # zero rows before and after the sequence
    cols = []
    for j in range(2 * w + 1):
        shifted = kp[:, j * d: j * d + seq, :]  # row i reads K[i + d*j - d*w]
        cols.append((q * shifted).sum(-1))
    return torch.stack(cols, dim=-1)


def gbmm_ref(s: torch.Tensor, v: torch.Tensor, w: int, d: int) -> torch.Tensor:
    """O[b, i, n] = sum_j S[b, i, j] V[b, i + d (j - w), n], zero outside the sequence."""
    seq = v.shape[1]
    vp = F.pad(v, (0, 0, d * w, d * w))
    out = torch.zeros_like(v)
    for j in range(2 * w + 1):
        out = out + s[:, :, j:j + 1] * vp[:, j * d: j * d + seq, :]
    return out
