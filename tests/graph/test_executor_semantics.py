"""The reference executor agrees with the lowerings (``ollie.interpret`` of ``lower_node``) on
single-node graphs, including the attribute forms PyTorch has no direct call for (asymmetric
padding, average-pool divisors with ceil mode), and max-pooling with asymmetric padding agrees
with an explicit -inf padding."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import ollie
from ollie.errors import OllieError
from ollie.graph import Graph, Node, run_graph


def _single(op: str, x_shape: tuple[int, ...], attrs: dict, inits: dict[str, np.ndarray]
            ) -> Graph | None:
    ins = ("x", *inits)
    g = Graph([("x", x_shape)], ["y"], [Node(op, ins, ("y",), attrs)], dict(inits))
    try:
        return g.infer_shapes()
    except OllieError:
        return None


def _agree(g: Graph, x: np.ndarray) -> None:
    got = run_graph(g, {"x": torch.from_numpy(x)})["y"].numpy()
    low = g.lower_node(g.nodes[0])
    want = ollie.interpret(low.expr, {"x": x, **g.initializers, **low.consts})
    assert got.shape == want.shape == tuple(low.output_shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


pads = st.one_of(st.integers(0, 2), st.tuples(*[st.integers(0, 2)] * 4))


@settings(max_examples=30)
@given(h=st.integers(3, 7), w=st.integers(3, 7), k=st.integers(1, 3), s=st.integers(1, 2),
       d=st.integers(1, 2), pad=pads, transposed=st.booleans(), bias=st.booleans(),
       seed=st.integers(0, 99))
def test_conv_family(h: int, w: int, k: int, s: int, d: int, pad: object, transposed: bool,
                     bias: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cin, cout = 2, 3
    wshape = (cin, cout, k, k) if transposed else (cout, cin, k, k)
    inits = {"wt": rng.standard_normal(wshape).astype(np.float32)}
    if bias:
        inits["bias"] = rng.standard_normal(cout).astype(np.float32)
    attrs = {"stride": s, "padding": pad, "dilation": d}
    g = _single("ConvTranspose2d" if transposed else "Conv2d", (1, cin, h, w), attrs, inits)
    assume(g is not None)
    _agree(g, rng.standard_normal((1, cin, h, w)).astype(np.float32))


@settings(max_examples=30)
@given(h=st.integers(2, 8), w=st.integers(2, 8), k=st.integers(1, 3), s=st.integers(1, 3),
       pad=pads, ceil=st.booleans(), include=st.booleans(), seed=st.integers(0, 99))
def test_avg_pool(h: int, w: int, k: int, s: int, pad: object, ceil: bool, include: bool,
                  seed: int) -> None:
    attrs = {"kernel_size": k, "stride": s, "padding": pad, "ceil_mode": ceil,
             "count_include_pad": include}
    g = _single("AvgPool2d", (1, 2, h, w), attrs, {})
    assume(g is not None and all(d > 0 for d in g.shapes["y"]))
    _agree(g, np.random.default_rng(seed).standard_normal((1, 2, h, w)).astype(np.float32))


def test_max_pool_asymmetric() -> None:
    x = torch.randn(1, 2, 7, 6)
    attrs = {"kernel_size": 3, "stride": 2, "padding": (0, 1, 2, 0), "dilation": 1}
    g = _single("MaxPool2d", (1, 2, 7, 6), attrs, {})
    assert g is not None
    want = F.max_pool2d(F.pad(x, (1, 0, 0, 2), value=float("-inf")), 3, 2)
    torch.testing.assert_close(run_graph(g, {"x": x})["y"], want)


def test_reshape_gemm_concat_band() -> None:
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((5, 12)).astype(np.float32),
             "c": rng.standard_normal(5).astype(np.float32)}
    nodes = [Node("Reshape", ("x",), ("r",), {"shape": (0, -1)}),
             Node("Gemm", ("r", "w", "c"), ("g",), {"transB": 1, "alpha": 0.5}),
             Node("Concat", ("g", "g"), ("y",), {"axis": 1})]
    g = Graph([("x", (2, 3, 4))], ["y"], nodes, inits).infer_shapes()
    assert g.shapes["y"] == (2, 10)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    env = {"x": x, **inits}
    got = run_graph(g, {"x": torch.from_numpy(x)})
    for node in g.nodes:
        low = g.lower_node(node)
        val = ollie.interpret(low.expr, {**env, **low.consts})
        env[node.outputs[0]] = val
    np.testing.assert_allclose(got["y"].numpy(), env["y"], rtol=1e-4, atol=1e-5)
    band = Graph([("x", (2, 9, 3))], ["y"],
                 [Node("G2BMM", ("x", "x"), ("s",), {"width": 2, "dilation": 2}),
                  Node("GBMM", ("s", "x"), ("y",), {"dilation": 2})]).infer_shapes()
    assert band.shapes["s"] == (2, 9, 5) and band.shapes["y"] == (2, 9, 3)
    xb = rng.standard_normal((2, 9, 3)).astype(np.float32)
    low_s = band.lower_node(band.nodes[0])
    s = ollie.interpret(low_s.expr, {"x": xb})
    low_y = band.lower_node(band.nodes[1])
    y = ollie.interpret(low_y.expr, {"x": xb, "s": s})
    np.testing.assert_allclose(band(torch.from_numpy(xb)).numpy(), y, rtol=1e-4, atol=1e-4)
