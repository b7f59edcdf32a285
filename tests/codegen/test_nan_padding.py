"""A known defect, found by the graph fuzzer (tests/fuzz/test_fuzz_graphs.py): NaN and
infinities spread through the eOperators derived from transposed convolutions.

The search rewrites a depthwise ``ConvTranspose2d`` (kernel 2, stride 1) into the gather
below, which sums over the whole input row and reads the kernel out of bounds (zero padding)
for all but two terms. By the expression semantics (EXPR_SYNTAX.md: a read out of bounds is
0) each such term is ``0 * x``, and ``0 * NaN`` is NaN: one NaN in the input makes its whole
output row NaN, where the model (and ``F.conv_transpose2d``) puts NaN in two columns. The
generated kernel follows the interpreter, so both give the row. A fix is a decision on the
semantics (a term reading out of bounds is absent: zero padding annihilates the product),
made in the interpreter and both code generators together.
"""

import numpy as np
import torch
import torch.nn.functional as F

import ollie
from ollie.codegen.cpu import compile_cpu

DERIVED = """
x0: [2, 7, 1, 8]
x1: [7, 1, 2, 2]
L<n=0:2, c=0:7, h=0:2, w=0:9> Sum<f=0:1, y=0:1, x=0:8>
    x0[n, c + f, y, x] * x1[c + f, 0, h - y, w - x]
"""


def test_derived_transposed_convolution_keeps_nan_where_the_model_does() -> None:
    expr = ollie.parse(DERIVED)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 1, 8)).astype(np.float32)
    w = rng.standard_normal((7, 1, 2, 2)).astype(np.float32)
    x[0, 2, 0, 3] = np.nan
    want = F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), groups=7).numpy()
    got = compile_cpu(expr)({"x0": x, "x1": w})
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite & np.isfinite(got)], want[finite & np.isfinite(got)],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
