"""The implementation policy (ollie.policy): with the kernel library off, no chooser offers a
hand-written kernel (Winograd, blocked GEMM, band, pool), the vendor paths compute what the
reference interpreter computes, and a restricted policy joins the cache keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ollie
from ollie.exec import conv, linear
from ollie.exec.executor import CompiledProgram
from ollie.exec.node import node_fn
from ollie.graph import Node
from ollie.libs import torch_band
from ollie.policy import (
    ALL,
    BAND,
    HAND_WRITTEN,
    VENDOR,
    VENDOR_ONLY,
    WINOGRAD,
    Implementations,
)
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, NodeParams
from ollie.program.program import Program
from ollie.tune.cache import device_key
from ollie.tune.choice import Choices


def _raise(*args, **kwargs):
    raise AssertionError("a hand-written kernel was called under the vendor-only policy")


def test_policy_values_and_keys():
    assert ALL.kernel_library and not VENDOR_ONLY.kernel_library
    assert ALL.key == "" and VENDOR_ONLY.key == "impls:vendor"
    only_band = Implementations(VENDOR | {BAND})
    assert only_band.key == "impls:band" and only_band.allows(BAND)
    assert not only_band.allows(WINOGRAD) and only_band.describe().endswith("band")
    assert ALL.allowed == VENDOR | HAND_WRITTEN
    with pytest.raises(ValueError, match="cannot be switched off"):
        Implementations(frozenset({WINOGRAD}))
    with pytest.raises(ValueError, match="unknown"):
        Implementations(VENDOR | {"cuBLASLt"})


def test_restricted_policy_joins_the_device_key(ollie_settings):
    full = device_key("cpu")
    ollie_settings(implementations=VENDOR_ONLY)
    assert device_key("cpu") == f"{full}:impls:vendor"


def _builders_of(monkeypatch, **kwargs) -> tuple[list[str], tuple]:
    """The implementation names and key :func:`conv.best_conv` hands to the choice table for
    a convolution large enough to be offered a Winograd form."""
    seen: list = []

    def fastest_of(self, builders, input_shape, key, make_args=None, prefer=None,
                   baseline=None):
        seen.append((sorted(builders), key))
        return lambda x: x

    monkeypatch.setattr(Choices, "fastest_of", fastest_of)
    w = torch.randn(64, 64, 3, 3)
    assert conv.offers_winograd("Conv2d", tuple(w.shape), (1, 64, 56, 56), (1, 1), (1, 1),
                                (1, 1))
    conv.best_conv("Conv2d", w, None, (1, 64, 56, 56), (1, 1), (1, 1), (1, 1), **kwargs)
    return seen[0]


def test_convolution_offers_winograd_only_with_the_kernel_library(monkeypatch):
    names, key = _builders_of(monkeypatch)
    assert WINOGRAD in names and "impls:vendor" not in key
    names, key = _builders_of(monkeypatch, impls=VENDOR_ONLY)
    assert WINOGRAD not in names and {"oneDNN packed", "torch", "ONNX Runtime"} <= set(names)
    assert key[-1] == "impls:vendor"  # never the key of a choice made with Winograd


def test_vendor_only_setting_reaches_the_convolution_choice(monkeypatch, ollie_settings):
    ollie_settings(implementations=VENDOR_ONLY)
    names, _ = _builders_of(monkeypatch)
    assert WINOGRAD not in names


@pytest.mark.skipif(not linear.available(), reason="no oneDNN matmul in this torch build")
def test_matrix_products_offer_the_blocked_gemm_only_with_the_kernel_library(monkeypatch):
    from ollie.kernels import blocked_gemm

    a, b = torch.randn(8, 64), torch.randn(64, 32)
    assert "blocked" in linear.implementations(a, b, constant=(False, True), impls=ALL)
    monkeypatch.setattr(blocked_gemm, "blocked_products", _raise)
    monkeypatch.setattr(blocked_gemm, "grouped_products", _raise)
    impls = linear.implementations(a, b, constant=(False, True), impls=VENDOR_ONLY)
    assert "blocked" not in impls and "oneDNN packed" in impls
    name, fn = linear.best_product(a, b, constant=(False, True), impls=VENDOR_ONLY,
                                   choices=Choices())
    assert name != "blocked"
    torch.testing.assert_close(fn(a, b).reshape(8, 32), a @ b, rtol=1e-4, atol=1e-4)


G2BMM = "Q: [2, 13, 4]\nK: [2, 13, 4]\nL<b=0:2, i=0:13, j=0:5> Sum<k=0:4> " \
        "Q[b, i, k] * K[b, i + 3*j - 6, k]"
GBMM = "S: [2, 13, 5]\nV: [2, 13, 3]\nL<b=0:2, i=0:13, n=0:3> Sum<j=0:5> " \
       "S[b, i, j] * V[b, i + 3*j - 6, n]"


@pytest.mark.parametrize("kind, text", [("G2BMM", G2BMM), ("GBMM", GBMM)])
def test_band_kernels_run_on_the_vendor_path_under_the_vendor_policy(kind, text, monkeypatch):
    from ollie.kernels import band

    expr = ollie.parse(text)
    names = [n for n, _ in expr.decls]
    params = {"b": 2, "m": 13, "w": 2, "d": 3, ("k" if kind == "G2BMM" else "n"): 4
              if kind == "G2BMM" else 3}
    k = Kernel(kind, params, tuple(names), "y", expr)
    prog = Program(tuple(expr.decls), ("y",), [k], {})
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}
    want = ollie.interpret(expr, feeds)
    monkeypatch.setattr(band, "g2bmm", _raise)
    monkeypatch.setattr(band, "gbmm", _raise)
    got = CompiledProgram(prog, impls=VENDOR_ONLY).run(feeds)["y"]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError, match="hand-written"):
        CompiledProgram(prog, impls=ALL).run(feeds)


@pytest.mark.parametrize("w, d, m", [(0, 1, 5), (2, 1, 9), (1, 4, 9), (3, 2, 4)])
def test_torch_band_matches_the_interpreter(w, d, m):
    rng = np.random.default_rng(w * 10 + d)
    q, k = (rng.standard_normal((2, m, 3)).astype(np.float32) for _ in range(2))
    g2 = ollie.parse(f"Q: [2, {m}, 3]\nK: [2, {m}, 3]\nL<b=0:2, i=0:{m}, j=0:{2 * w + 1}> "
                     f"Sum<k=0:3> Q[b, i, k] * K[b, i + {d}*j - {d * w}, k]")
    s = ollie.interpret(g2, {"Q": q, "K": k})
    got = torch_band.g2bmm(torch.from_numpy(q), torch.from_numpy(k), w, d)
    np.testing.assert_allclose(got.numpy(), s, rtol=1e-5, atol=1e-5)
    gb = ollie.parse(f"S: [2, {m}, {2 * w + 1}]\nV: [2, {m}, 3]\nL<b=0:2, i=0:{m}, n=0:3> "
                     f"Sum<j=0:{2 * w + 1}> S[b, i, j] * V[b, i + {d}*j - {d * w}, n]")
    o = ollie.interpret(gb, {"S": s, "V": k})
    got = torch_band.gbmm(torch.from_numpy(s), torch.from_numpy(k), w, d)
    np.testing.assert_allclose(got.numpy(), o, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="2w\\+1"):
        torch_band.gbmm(torch.from_numpy(s)[..., :1], torch.from_numpy(k), w + 1, d)


def _node_kernel(op: str, attrs: dict, inputs: tuple[str, ...], shape: tuple[int, ...]
                 ) -> Kernel:
    node = Node(op, inputs, ("y",), attrs, "n0")
    return Kernel(KernelKind.NODE, NodeParams(node=node, op=op), inputs, "y", None, (), shape)


def test_original_band_and_pool_operators_skip_ollie_kernels_under_the_vendor_policy(
        monkeypatch):
    from ollie.kernels import pool

    monkeypatch.setattr(pool, "max_pool_runner", _raise)
    x = torch.randn(1, 2, 8, 8)
    k = _node_kernel("MaxPool2d", {"kernel_size": 2, "stride": 2}, ("x",), (1, 2, 4, 4))
    got = node_fn(k, {}, impls=VENDOR_ONLY)({"x": x}, None)
    torch.testing.assert_close(got, torch.nn.functional.max_pool2d(x, 2, 2))
    with pytest.raises(AssertionError, match="hand-written"):
        node_fn(k, {}, impls=ALL)({"x": x}, None)
    # the original G2BMM operator: windowed torch.matmul products, not the zoo's custom op
    expr = ollie.parse(G2BMM)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}
    g = _node_kernel("G2BMM", {"width": 2, "dilation": 3}, ("Q", "K"), (2, 13, 5))
    got = node_fn(g, {}, impls=VENDOR_ONLY)({n: torch.from_numpy(v) for n, v in feeds.items()},
                                            None)
    np.testing.assert_allclose(got.numpy(), ollie.interpret(expr, feeds), rtol=1e-4, atol=1e-4)
