"""The scatter form of unimodular single-read sums (``ollie.codegen.scatter``) and the measured
choice between it and the gather nest: the interpreter is the oracle."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie.codegen.analysis import FLOAT64_TERMS
from ollie.codegen.cache import load_path
from ollie.codegen.cpu import compile_cpu, generate_source
from ollie.codegen.scatter import _invert, scatter_form
from ollie.semantics import random_inputs

CONV_TRANSPOSE_ADD = """
    Y: [2, 5, 4, 3, 4, 4]
    L<n=0:2, c=0:3, h=0:10, w=0:8> Sum<y=0:5, x=0:4> Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]
"""


def _unimodular(n: int, rnd: random.Random) -> list[list[int]]:
    """A random integer matrix with determinant +-1: row 0 is e_0 (so iterator 0 alone is input
    dimension 0: a parallel dimension), the other rows a random product of elementary
    operations, sign flips and a row permutation."""
    m = [[int(i == j) for j in range(n)] for i in range(n)]
    for _ in range(3 * n):
        i, j = rnd.sample(range(1, n), 2) if n > 2 else (1, 0)
        k = rnd.choice([-2, -1, 1, 2])
        m[i] = [a + k * b for a, b in zip(m[i], m[j], strict=True)]
    rows = m[1:]
    rnd.shuffle(rows)
    return [m[0]] + [[-v for v in r] if rnd.random() < 0.3 else r for r in rows]


def _affine_text(row: list[int], names: list[str], const: int) -> str:
    parts = [f"{c}*{n}" for c, n in zip(row, names, strict=True) if c]
    return (" + ".join(parts) + f" + {const}").replace("+ -", "- ") if parts else str(const)


def _random_sum(rnd: random.Random) -> str:
    n_trav, n_sum = rnd.randint(2, 3), rnd.randint(1, 2)
    names = [f"t{i}" for i in range(n_trav)] + [f"s{i}" for i in range(n_sum)]
    m = _unimodular(n_trav + n_sum, rnd)
    shape = [rnd.randint(1, 5) for _ in names]
    ranges = []
    for _ in names:
        lo = rnd.randint(-2, 1)
        ranges.append((lo, lo + rnd.randint(1, 4)))
    idx = ", ".join(_affine_text(row, names, rnd.randint(-2, 2)) for row in m)
    trav = ", ".join(f"{n}={lo}:{hi}" for n, (lo, hi) in zip(names[:n_trav], ranges,
                                                            strict=False))
    summ = ", ".join(f"{n}={lo}:{hi}" for n, (lo, hi) in zip(names[n_trav:], ranges[n_trav:],
                                                            strict=True))
    return f"X: {shape}\nL<{trav}> Sum<{summ}> X[{idx}]"


def _run_as_python(source: str, inputs: list[np.ndarray], size: int) -> np.ndarray:
    """Execute generated module text with plain Python loops (numba's decorators made
    identities): the same integer arithmetic numba compiles, without compiling."""
    text = source.replace("from numba import njit, prange  # noqa: F401",
                          "prange = range\ndef njit(*a, **k):\n    return lambda f: f")
    namespace: dict = {}
    exec(compile(text, "<scatter>", "exec"), namespace)
    out = np.full(size, np.nan, np.float32)
    namespace["run"](*(a.reshape(-1) for a in inputs), out)
    return out


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_scatter_source_equals_the_interpreter_on_random_unimodular_sums(rnd):
    text = _random_sum(rnd)
    expr = ollie.parse(text)
    form = scatter_form(expr, FLOAT64_TERMS)
    assert form is not None and form.parallel_levels() >= 1, text
    source = generate_source(expr, form="scatter")
    inputs = random_inputs(expr, seed=rnd.randint(0, 99))
    got = _run_as_python(source, [inputs[n] for n, _ in expr.decls], int(np.prod(expr.shape)))
    np.testing.assert_allclose(got.reshape(expr.shape), ollie.interpret(expr, inputs),
                               rtol=1e-5, atol=1e-5, err_msg=text)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.randoms(use_true_random=False))
def test_invert_gives_the_integer_inverse_of_unimodular_matrices(n, rnd):
    m = _unimodular(n, rnd)
    inv = _invert(m)
    assert inv is not None
    assert [[sum(m[i][k] * inv[k][j] for k in range(n)) for j in range(n)]
            for i in range(n)] == [[int(i == j) for j in range(n)] for i in range(n)]
    doubled = [row[:] for row in m]
    doubled[n - 1] = [2 * v for v in doubled[n - 1]]  # det 2: no integer inverse
    assert _invert(doubled) is None
    singular = [row[:] for row in m]
    singular[n - 1] = singular[0][:]
    assert _invert(singular) is None


@pytest.mark.parametrize("text", [
    "A: [4, 3, 2]\nL<i=0:4> Sum<k=0:3> A[i, k, 1]",  # not square
    "A: [4, 6]\nL<i=0:4> Sum<k=0:6> A[i, k] * A[i, k]",  # not a single read
    "A: [4, 6]\nL<i=0:4, j=0:3> A[i, 2*j]",  # no summation
    "A: [4, 8]\nL<i=0:4> Sum<k=0:4> A[i, 2*k]",  # det 2
    f"A: [2, {FLOAT64_TERMS}]\nL<i=0:2> Sum<k=0:{FLOAT64_TERMS}> A[i, k]",  # float64 sum
])
def test_no_scatter_form(text):
    assert scatter_form(ollie.parse(text), FLOAT64_TERMS) is None


def test_scatter_form_requires_a_parallel_dimension():
    # no traversal iterator is determined by input dimension 0 alone
    form = scatter_form(ollie.parse("A: [6, 3]\nL<i=0:4> Sum<k=0:3> A[i + k, k]"), FLOAT64_TERMS)
    assert form is not None and form.parallel_levels() == 0
    with pytest.raises(ValueError, match="no parallel scatter form"):
        generate_source(ollie.parse("A: [6, 3]\nL<i=0:4> Sum<k=0:3> A[i + k, k]"),
                        form="scatter")


def test_scatter_kernel_compiled_by_numba_matches_the_interpreter(tmp_path):
    expr = ollie.parse(CONV_TRANSPOSE_ADD)
    path = tmp_path / "scatter_ct.py"
    path.write_text(generate_source(expr, form="scatter"))
    module = load_path(path)
    inputs = random_inputs(expr, seed=3)
    out = np.full(int(np.prod(expr.shape)), np.nan, np.float32)
    module.run(inputs["Y"].reshape(-1), out)
    np.testing.assert_allclose(out.reshape(expr.shape), ollie.interpret(expr, inputs),
                               rtol=1e-5, atol=1e-5)
    # n leads the input and the output, so each parallel item zeroes its own output slice
    assert "zeroed per item" in path.read_text() and "def zero(out)" not in path.read_text()


def test_compile_cpu_times_both_forms_and_keeps_a_correct_kernel(tmp_path, caplog):
    expr = ollie.parse(CONV_TRANSPOSE_ADD)
    with caplog.at_level("DEBUG", logger="ollie.codegen.cpu"):
        kernel = compile_cpu(expr, cache_dir=tmp_path)
    assert any("eOp form:" in r.getMessage() and "gather" in r.getMessage()
               and "scatter" in r.getMessage() for r in caplog.records)
    # the trials took the kernel's file name and were unloaded: that name is the kernel's
    assert sys.modules[f"ollie_kernels.{kernel.path.stem}"].__file__ == str(kernel.path)
    assert not [m for m in sys.modules if m.startswith("ollie_kernels.trial_")]
    # the winning trial's nest functions are the kernel's: compiled once, not again
    functions = [f for f in vars(kernel.module).values() if hasattr(f, "stats")]
    assert functions and all(sum(f.stats.cache_hits.values()) +
                             sum(f.stats.cache_misses.values()) == 1 for f in functions)
    inputs = random_inputs(expr, seed=4)
    np.testing.assert_allclose(kernel(inputs), ollie.interpret(expr, inputs), rtol=1e-5,
                               atol=1e-5)


SCOPED_TRANSPOSE_ADD = """
    T: [2, 4, 3, 3, 4, 4]
    L<n=0:2, c=0:3, h=0:8, w=0:6> Sum<y=0:4, x=0:3>
        { L<n=0:2, c=0:3, t=-1:3, u=-1:3, y=0:4, x=0:3> T[n, y, x, c, t + 1, u + 1] }
        [n, c, h - 2*y, w - 2*x, y, x]
"""
"""A Matmul output re-laid out by a nested scope and summed selectively (the last eOperator of
a ConvTranspose -> Matmul derivation): the scope's ranges are implied by T's bounds."""


def test_a_nested_layout_scope_is_flattened_into_a_scatter_form(tmp_path):
    from ollie.codegen.scatter import flattened

    expr = ollie.parse(SCOPED_TRANSPOSE_ADD)
    assert scatter_form(expr, FLOAT64_TERMS) is None  # the root reads a scope
    flat = flattened(expr)
    assert flat is not None
    inputs = random_inputs(expr, seed=5)
    want = ollie.interpret(expr, inputs)
    np.testing.assert_allclose(ollie.interpret(flat, inputs), want, rtol=1e-6, atol=1e-6)
    assert scatter_form(flat, FLOAT64_TERMS) is not None
    kernel = compile_cpu(expr, cache_dir=tmp_path)
    np.testing.assert_allclose(kernel(inputs), want, rtol=1e-5, atol=1e-5)


def test_flattened_declines_what_does_not_inline_into_one_read():
    from ollie.codegen.scatter import flattened

    # nothing nested
    assert flattened(ollie.parse(CONV_TRANSPOSE_ADD)) is None
    # the nested scope's range (t < 2) is not implied by A's bounds (4): kept as a temporary
    assert flattened(ollie.parse(
        "A: [4, 4]\nL<i=0:4> Sum<k=0:4> { L<t=0:2, s=0:4> A[t, s] }[i - k, k]")) is None


def test_a_strided_selective_sum_runs_only_its_in_bounds_taps(monkeypatch):
    """A summation loop of 8 values of which a stride-2 clamp admits 2 runs 2 trips (with a
    mask), not 8 masked ones; the result is exact. (Residue splitting, which would remove the
    clamp, is turned off: the clamp remains where a split is not possible.)"""
    from ollie.codegen import residue

    monkeypatch.setattr(residue, "MAX_RESIDUE_NESTS", 1)
    text = """
        T: [2, 3, 4, 4, 8, 8]
        L<n=0:2, c=0:3, h=0:16, w=0:16> Sum<y=0:8, x=0:8> T[n, c, h - 2*y + 1, w - 2*x + 1, y, x]
    """
    expr = ollie.parse(text)
    source = generate_source(expr)
    assert "for _t0 in range(2):" in source and "range(0, 8)" not in source
    inputs = random_inputs(expr, seed=7)
    out = _run_as_python(source, [inputs["T"]], int(np.prod(expr.shape)))
    np.testing.assert_allclose(out.reshape(expr.shape), ollie.interpret(expr, inputs),
                               rtol=1e-5, atol=1e-5)


def test_scatter_kernel_zeroed_beforehand_compiles_and_matches(tmp_path):
    """A scatter form whose parallel input dimensions are not the output's leading ones zeroes
    the output in a separate parallel loop (``zero(out)``, one argument) before scattering
    (a Conv5x5 -> Conv derivation's tap sum over a channel-moved conv output)."""
    expr = ollie.parse("T: [2, 6, 1, 6, 5]\n"
                       "L<n=0:2, f=0:1, h=0:6, w=0:6> Sum<s=0:5> T[n, h, f, w + s - 2, s]")
    path = tmp_path / "scatter_zero.py"
    path.write_text(generate_source(expr, form="scatter"))
    assert "def zero(out" in path.read_text()
    module = load_path(path)  # numba compiles both functions for their signatures here
    inputs = random_inputs(expr, seed=8)
    out = np.full(int(np.prod(expr.shape)), np.nan, np.float32)
    module.run(inputs["T"].reshape(-1), out)
    np.testing.assert_allclose(out.reshape(expr.shape), ollie.interpret(expr, inputs),
                               rtol=1e-5, atol=1e-5)


def _wrapped(fn: str | None) -> str:
    """:data:`SCOPED_TRANSPOSE_ADD` read whole by a root, through ``fn`` if given."""
    read = ("{ L<n=0:2, c=0:3, h=0:8, w=0:6> Sum<y=0:4, x=0:3> "
            "{ L<n=0:2, c=0:3, t=-1:3, u=-1:3, y=0:4, x=0:3> T[n, y, x, c, t + 1, u + 1] }"
            "[n, c, h - 2*y, w - 2*x, y, x] }[n, c, h, w]")
    return "T: [2, 4, 3, 3, 4, 4]\nL<n=0:2, c=0:3, h=0:8, w=0:6> " + \
        (f"{fn}({read})" if fn else read)


@pytest.mark.parametrize("fn", [None, "tanh", "relu"])
def test_a_root_applying_a_function_to_a_selective_sum_keeps_it(tmp_path, fn):
    """``f({selective sum}[n, c, h, w])``: the sum's nest writes the output and applies ``f``
    (the root is forwarded), so the flattened form, which is the nest's scope only, exists
    only without ``f``; the kernel (either form, whichever is faster) matches the
    interpreter."""
    from ollie.codegen.scatter import flattened

    expr = ollie.parse(_wrapped(fn))
    inputs = random_inputs(expr, seed=6)
    want = ollie.interpret(expr, inputs)
    flat = flattened(expr)
    if fn is None:
        assert flat is not None
        np.testing.assert_allclose(ollie.interpret(flat, inputs), want, rtol=1e-6, atol=1e-6)
    else:
        assert flat is None
    kernel = compile_cpu(expr, cache_dir=tmp_path)
    np.testing.assert_allclose(kernel(inputs), want, rtol=1e-5, atol=1e-5)
