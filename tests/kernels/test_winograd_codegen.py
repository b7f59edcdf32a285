"""The Winograd transform generator (:mod:`ollie.kernels.winograd_codegen`): a transform pass
is one loop over columns around one loop over channels, and computes the matrix product it
stands for (run as Python on random data, against numpy)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ollie.kernels.winograd_codegen import float_constants, scratch_row, transform_pass


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5), n=st.integers(1, 5), cols=st.integers(1, 5),
       cb=st.integers(1, 4), swap=st.booleans(), seed=st.integers(0, 2**16))
def test_a_transform_pass_is_one_channel_loop_computing_the_product(rows, n, cols, cb, swap,
                                                                   seed) -> None:
    # whatever the number of columns, a pass is one loop over columns around one loop over
    # channels (its text, and numba's work compiling it, does not grow with them), and run
    # as Python it computes dst(i, j) = sum_k mat[i][k] src(k, j) per channel
    rng = np.random.default_rng(seed)
    mat = [[Fraction(int(rng.integers(-3, 4)), int(rng.integers(1, 3))) for _ in range(n)]
           for _ in range(rows)]
    # element (a, j) of a [a][j] scratch, or of a [j][a] one with swap
    lines = transform_pass(mat, rows, n, scratch_row("src", n if swap else cols, cb, swap),
                           scratch_row("dst", rows if swap else cols, cb, swap), cols, "C")
    assert sum(line.lstrip().startswith("for c in range") for line in lines) == 1
    assert sum(line.lstrip().startswith("for j in range") for line in lines) == 1
    src = rng.standard_normal((n, cols, cb))
    names = {"np": np}
    exec(float_constants(mat), names)  # the constants the pass refers to
    flat = {"src": (src.transpose(1, 0, 2) if swap else src).ravel(), "C": cb,
            "dst": np.zeros(rows * cols * cb)}
    exec("\n".join(lines), names, flat)
    want = np.einsum("ik,kjc->ijc", np.array(mat, dtype=float), src)
    got = flat["dst"].reshape((cols, rows, cb)).transpose(1, 0, 2) if swap else \
        flat["dst"].reshape((rows, cols, cb))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
