"""The numba CPU eOperator backend against the reference interpreter.

Random expressions (with nested scopes) from ``ollie.testing.strategies`` and hand cases from
the derivations the search produces (offset-add of a conv-to-matmul, transposed-conv selective
add, layout transforms with div/mod, fused element-wise chains), plus the structure of the
generated code (interior loop without bounds checks) and the on-disk cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie.codegen import compile_eop
from ollie.codegen.cpu import compile_cpu, generate_source
from ollie.codegen.plan import make_plan
from ollie.errors import ShapeError, UnsupportedError
from ollie.ir import Access, BinOp, Call, Const, Expr, Iter, Node, Scope, neg, var
from ollie.semantics import random_inputs
from ollie.semantics.check import _compare_arrays
from ollie.testing.strategies import (
    exprs,
    index_exprs,
    inputs_with_specials,
    iters,
    padded_products,
    scopes,
)


def check(expr: Expr | str, inputs=None, seed: int = 0) -> np.ndarray:
    """Compile, run and compare with the interpreter; returns the kernel's result."""
    if isinstance(expr, str):
        expr = ollie.parse(expr)
    inputs = random_inputs(expr, seed) if inputs is None else inputs
    got = compile_cpu(expr)(inputs)
    want = ollie.interpret(expr, inputs)
    assert got.shape == want.shape and got.dtype == np.float32
    res = _compare_arrays(got.astype(np.float64), want.astype(np.float64), 1e-4, 1e-5)
    assert res.ok, f"{expr}\nmax abs err {res.max_abs_err}, rel {res.max_rel_err}\n" \
                   f"got {got}\nwant {want}"
    return got


def assert_matches_with_specials(got: np.ndarray, want: np.ndarray) -> None:
    """NaN where the interpreter gives NaN, the same infinities, finite values close."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------- random expressions
@st.composite
def nested_exprs(draw) -> Expr:
    """A root scope that reads a random nested scope (and maybe a tensor) at random indices."""
    decls: dict[str, tuple[int, ...]] = {}
    for name in ("A", "B")[: draw(st.integers(1, 2))]:
        decls[name] = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    inner = draw(scopes(decls, depth=1, max_sum=1))
    taken: set[str] = set()
    trav = draw(iters(1, 3, taken))
    summ = draw(iters(0, 1, taken))
    names = tuple(it.name for it in trav + summ)
    body = Access(inner, tuple(draw(index_exprs(names)) for _ in inner.traversal))
    if draw(st.booleans()):
        t = draw(st.sampled_from(sorted(decls)))
        other = Access(t, tuple(draw(index_exprs(names)) for _ in decls[t]))
        body = BinOp(draw(st.sampled_from("+*-")), body, other)
    return Expr(tuple(decls.items()), Scope(trav, summ, body))


@st.composite
def padded_exprs(draw) -> Expr:
    """Gathers from larger tensors with partly out-of-range affine indices (interiors are
    non-empty), bodies of one read (clamped summations) or a few."""
    shape = tuple(draw(st.lists(st.integers(2, 7), min_size=1, max_size=3)))
    taken: set[str] = set()
    trav = tuple(Iter(it.name, it.lo, it.lo + draw(st.integers(1, 7)))
                 for it in draw(iters(1, 3, taken)))
    summ = draw(iters(0, 2, taken))
    names = tuple(it.name for it in trav + summ)

    def read() -> Access:
        return Access("A", tuple(draw(index_exprs(names, allow_divmod=draw(st.booleans())))
                                 for _ in shape))

    body = read()
    kind = draw(st.integers(0, 3))
    if kind == 1:
        body = neg(BinOp("*", Const(0.5), body))
    elif kind == 2:
        body = BinOp(draw(st.sampled_from("+*-")), body, read())
    elif kind == 3:
        body = BinOp("+", Call("relu", (body,)), BinOp("*", read(), Const(2.0)))
    return Expr((("A", shape),), Scope(trav, summ, body))


@st.composite
def wrapped_exprs(draw) -> Expr:
    """``f(S[i, j, ...])`` over ``S``'s own ranges for a random scope ``S`` (summations of
    one value among its iterators now and then) and ``f`` none or a unary function: the root
    a nest may absorb (``ollie.codegen.plan._forward``)."""
    decls = {"A": tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))}
    inner = draw(scopes(decls, depth=1, max_sum=2))
    read: Node = Access(inner, tuple(var(it.name) for it in inner.traversal))
    fn = draw(st.sampled_from([None, "relu", "tanh", "abs", "exp"]))
    body = read if fn is None else Call(fn, (read,))
    return Expr(tuple(decls.items()), Scope(inner.traversal, (), body))


@settings(max_examples=30, deadline=None)
@given(wrapped_exprs())
def test_random_wrapped_scopes_match_interpreter(expr):
    check(expr, seed=5)


@settings(max_examples=20, deadline=None)
@given(padded_exprs())
def test_random_padded_gathers_match_interpreter(expr):
    check(expr, seed=3)


@settings(max_examples=25, deadline=None)
@given(exprs(depth=1))
def test_random_expressions_match_interpreter(expr):
    check(expr, seed=1)


@settings(max_examples=15, deadline=None)
@given(nested_exprs())
def test_random_nested_scopes_match_interpreter(expr):
    check(expr, seed=2)


@settings(max_examples=30, deadline=None)
@given(padded_products(), st.data())
def test_padded_products_with_nan_and_inf_match_interpreter(expr, data):
    """NaN and infinities in the inputs: the kernel gives the interpreter's NaN positions and
    infinities (a read out of bounds annihilates the products it is a factor of, even where
    the other factor is NaN or infinite)."""
    check(expr, data.draw(inputs_with_specials(expr, max_specials=2)))


@settings(max_examples=20, deadline=None)
@given(st.one_of(exprs(depth=1), nested_exprs(), padded_exprs(), wrapped_exprs()), st.data())
def test_random_expressions_with_nan_and_inf_match_interpreter(expr, data):
    check(expr, data.draw(inputs_with_specials(expr)))


# --------------------------------------------------------------------- hand cases
OFFSET_ADD = """
    T: [1, 8, 7, 7, 3, 3]
    L<n=0:1, f=0:8, h=0:7, w=0:7> Sum<r=0:3, s=0:3> T[n, f, h + r - 1, w + s - 1, r, s]
"""


def test_conv_offset_add_with_padding():
    check(OFFSET_ADD)


def test_conv_offset_add_other_layout():
    check("""
        T: [3, 3, 2, 6, 5, 4]
        L<n=0:2, f=0:4, h=0:6, w=0:5> Sum<r=0:3, s=0:3> T[r, s, n, h + r - 1, w + s - 1, f]
    """)


def test_transposed_conv_selective_add():
    check("""
        Y: [2, 3, 3, 4, 4, 4]
        L<n=0:2, c=0:4, h=0:6, w=0:6> Sum<y=0:3, x=0:3>
            Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]
    """)


def test_layout_split_permute_and_divmod():
    check("A: [2, 12, 5]\nL<b=0:2, j=0:4, i=0:3, d=0:5> A[b, 4*i + j, d]")
    check("B: [2, 4, 3, 5]\nL<b=0:2, i=0:12, d=0:5> B[b, i % 4, i / 4, d]")
    # div/mod of the innermost iterator, with padding (stays checked in the interior)
    check("A: [7, 3]\nL<i=0:4, x=-3:20> A[(x + 1) / 3, x % 3] + A[i, x / 8]")


def test_elementwise_chain_relu_bias_with_fused_scopes():
    text = """
        A: [2, 3, 4, 5]
        B: [3]
        L<n=0:2, c=0:3, h=0:4, w=0:5>
            relu({ L<n=0:2, c=0:3, h=0:4, w=0:5> A[n, c, h, w] * 2 + B[c] }[n, c, h, w])
            + sigmoid(B[c]) - tanh(A[n, c, h, w]) * max(A[n, c, 0, w], B[c])
    """
    expr = ollie.parse(text)
    assert make_plan(expr).inlined == 1
    assert "tmp_0" not in generate_source(expr)
    check(expr)


def test_nested_scope_with_summation_is_materialised():
    text = """
        A: [4, 6]
        L<i=-1:5, j=0:3> Sum<k=0:2>
            { L<a=0:4, b=-1:4> Sum<c=0:6> A[a, c] * A[a, b + c] }[i, j + k - 1] * 0.5
    """
    expr = ollie.parse(text)
    src = generate_source(expr)
    assert "tmp_0 = np.empty(20, np.float32)" in src
    check(expr)


@pytest.mark.parametrize("fn", [None, "tanh", "relu", "abs"])
def test_root_that_copies_a_summed_scope_has_no_nest_of_its_own(fn):
    """``f({L<...> Sum<...> ...}[i, j])``: the nest computing the scope writes the output and
    applies ``f`` as it stores (no temporary, no copy nest); NaN and inf inputs propagate as
    in the interpreter."""
    inner = "{ L<a=0:4, b=-1:4> Sum<c=0:6> A[a, c] * A[a, b + c] }[i, j]"
    expr = ollie.parse(f"A: [4, 6]\nL<i=0:4, j=-1:4> {f'{fn}({inner})' if fn else inner}")
    plan = make_plan(expr)
    assert len(plan.nests) == 1 and not plan.temps and plan.nests[0].post == fn
    src = generate_source(expr)
    assert "tmp_0" not in src and "np.tanh" not in src
    check(expr)
    a = random_inputs(expr, 1)["A"]
    a[1, 2], a[2, 0], a[3, 5] = np.nan, np.inf, -np.inf
    assert_matches_with_specials(compile_cpu(expr)({"A": a}), ollie.interpret(expr, {"A": a}))


@pytest.mark.parametrize(("fn", "separate"), [("tanh", True), ("relu", False), ("abs", False)])
def test_tanh_of_residue_nests_is_a_pass_of_its_own(fn, separate):
    """``tanh`` of a strided selective sum (residue nests: strided writes, scalar loops) is
    applied by one flat pass over the output after the nests (a loop LLVM vectorises), with the
    same float32 arithmetic as when fused; cheap functions stay fused. NaN and inf propagate
    as in the interpreter."""
    body = "Sum<y=0:4, x=0:4> T[n, y, x, c, h - 2*y + 1, w - 2*x + 1]"
    it = "L<n=0:2, c=0:3, h=0:8, w=0:8>"
    expr = ollie.parse(f"T: [2, 4, 4, 3, 4, 4]\n{it} {fn}({{ {it} {body} }}[n, c, h, w])")
    src = generate_source(expr, literal_sizes=True)
    assert "more residue nest" in src
    assert ("def post_0(out)" in src) == separate and ("post_0(out)\n" in src) == separate
    check(expr)
    t = random_inputs(expr, 3)["T"]
    t[0, 1, 2, 1, 0, 0], t[1, 3, 0, 2, 1, 2], t[0, 0, 0, 0, 1, 1] = np.nan, np.inf, -np.inf
    assert_matches_with_specials(compile_cpu(expr)({"T": t}), ollie.interpret(expr, {"T": t}))
    # residue nests summing 4096 terms (2x2 taps of 1024 channels) accumulate in float64:
    # tanh stays fused (a pass would apply it to the sum rounded to float32)
    wide = ollie.parse("T: [1, 2, 2, 1024, 4, 4]\nL<n=0:1, h=0:4, w=0:4> tanh("
                       "{ L<n=0:1, h=0:4, w=0:4> Sum<y=0:2, x=0:2, k=0:1024> "
                       "T[n, y, x, k, h - 2*y + 1, w - 2*x + 1] }[n, h, w])")
    src = generate_source(wide)
    assert "residue" in src and "def post_0" not in src and "float64" in src, src
    check(wide)


def test_summations_of_one_value_are_dropped_and_the_scope_inlined():
    """``Sum<y=0:1>`` is its one term: the scope has no summation left and is inlined (an
    element-wise loop), also where that term reads out of bounds (0)."""
    for text in ("M: [3, 5, 1, 1]\nL<i=0:3, j=0:5> relu({ L<a=0:3, b=0:5> Sum<y=0:1, x=0:1> "
                 "M[a, b - y, y, x] }[i, j])",
                 "M: [3, 5]\nL<i=0:3, j=0:5> { L<a=0:3, b=0:5> Sum<y=1:2> M[a, b + y] }[i, j]"
                 " + M[i, j]"):
        expr = ollie.parse(text)
        plan = make_plan(expr)
        assert plan.inlined == 1 and not plan.temps and len(plan.nests) == 1
        assert not plan.nests[0].scope.summation
        check(expr)


def test_a_scope_read_once_takes_over_the_nested_sum_and_others_keep_the_temporary():
    """A body that is one read of a summed scope, each element read at most twice, becomes
    one nest summing both (``Sum_x {Sum_y g}[idx] = Sum_x Sum_y g(idx, y)``, here a
    transposed read and a stride-2 selective add); a scaled read, or a scope read many times
    per element, stays a temporary."""
    merged = ("A: [4, 6]\nL<i=0:4, j=0:4> { L<a=0:4, b=0:4> Sum<c=0:6> A[a, c] * A[b, c] }[j, i]",
              "T: [2, 4, 3, 4]\nL<n=0:2, h=0:8> Sum<y=0:4> "
              "{ L<n=0:2, t=-1:3, y=0:4> Sum<c=0:3> T[n, y, c, t + 1] }[n, h - 2*y, y]")
    for text in merged:
        expr = ollie.parse(text)
        plan = make_plan(expr)
        assert not plan.temps and len(plan.nests) == 1
        assert len(plan.nests[0].scope.summation) == len(expr.root.summation) + 1
        check(expr)
    kept = ("A: [4, 6]\nL<i=0:4, j=0:4> { L<a=0:4, b=0:4> Sum<c=0:6> A[a, c] * A[b, c] }[i, j]"
            " * 2",
            "A: [4, 6]\nL<i=0:4> Sum<k=0:4> { L<a=0:4> Sum<c=0:6> A[a, c] }[k]")
    for text in kept:
        expr = ollie.parse(text)
        assert len(make_plan(expr).temps) == 1
        check(expr)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1,
                max_size=64))
def test_generated_tanh_is_within_8_ulps(values):
    """The vectorisable ``tanh`` of the generated code (``ollie.codegen.body.TANH_PADE``):
    within 8 float32 ulps (or 3e-7 absolute) of numpy's, NaN stays NaN, +-inf gives +-1."""
    a = np.array(values, np.float32)
    got = compile_cpu(ollie.parse(f"A: [{a.size}]\nL<i=0:{a.size}> tanh(A[i])"))({"A": a})
    want = np.tanh(a.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    err = np.abs(got[ok].astype(np.float64) - want[ok])
    ulp = np.spacing(np.abs(want[ok]).astype(np.float32)).astype(np.float64)
    assert np.all((err <= 8 * ulp) | (err <= 3e-7)), (a[ok], got[ok], want[ok])
    assert np.all(np.signbit(got[ok]) == np.signbit(want[ok]))


def test_padding_at_both_ends_and_negative_ranges():
    check("A: [10]\nL<i=0:10> A[i - 2] + A[i + 2] * 3")
    check("A: [4, 3]\nL<i=-3:6, j=-2:4> A[i, j] - A[i + 1, 2 - j]")
    check("A: [5]\nL<i=-4:3> Sum<k=-2:2> { L<u=-2:4> A[u + 1] * A[u] }[i + k] * A[k + 2]")


def test_functions_follow_numpy():
    a = np.array([[-2.0, -0.0, 0.5, 4.0]], np.float32)
    got = check("A: [1, 4]\nL<i=0:1, j=0:4> log(A[i, j]) + sqrt(A[i, j]) + exp(A[i, j])"
                " + abs(A[i, j]) + min(A[i, j], 0.25) + A[i, j] / A[i, 3 - j]",
                {"A": a})
    assert np.isnan(got[0, 0]) and np.isinf(got[0, 1])


def test_nan_propagates_only_where_read():
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    a[1, 3] = np.nan
    got = check("A: [2, 4]\nL<i=0:2, j=0:6> A[i, j - 2] * 2 + relu(A[i, j + 2])", {"A": a})
    bad = np.argwhere(np.isnan(got)).tolist()
    assert bad == [[1, 1], [1, 5]]
    got = check("A: [2, 4]\nL<i=0:2, j=0:4> Sum<k=0:2> max(A[i, j + k - 1], 0.0)", {"A": a})
    assert np.argwhere(np.isnan(got)).tolist() == [[1, 3]]


def test_float64_accumulation_of_long_sums():
    text = "A: [4, 5000]\nL<i=0:4> Sum<k=0:5000> A[i, k] * A[i, k] - 1"
    assert "_F64" in generate_source(ollie.parse(text))
    check(text)


def test_large_outputs_use_prange_and_blocks():
    text = "A: [300000]\nL<i=0:300000> A[i - 3] + A[i + 3]"
    src = generate_source(ollie.parse(text))
    assert "prange(" in src and "_blk" in src
    check(text)
    text = """
        T: [4, 64, 12, 12, 3, 3]
        L<n=0:4, f=0:64, h=0:12, w=0:12> Sum<r=0:3, s=0:3> T[n, f, h + r - 1, w + s - 1, r, s]
    """
    assert "prange(256)" in generate_source(ollie.parse(text), literal_sizes=True)  # n, f fused
    check(text)


# --------------------------------------------------------------------- generated code
def _loop_body(src: str, marker: str) -> str:
    """The lines of the loop whose header ends with ``marker``."""
    lines = src.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.rstrip().endswith(marker))
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for ln in lines[start + 1:]:
        if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
            break
        body.append(ln)
    return "\n".join(body)


def test_padded_offset_add_has_unchecked_interior():
    src = generate_source(ollie.parse(OFFSET_ADD))
    interior = _loop_body(src, "# interior: no bounds checks")
    assert "in_0[" in interior
    assert not re.search(r"\bif\b|>= 0|< \d", interior), interior
    assert "range(0, 3)" in interior  # the summation loops keep their constant ranges
    boundary = _loop_body(src, "# boundary")
    # 3-value summation loops keep their constant ranges at the boundary too, with checked
    # reads instead of run-time clamped bounds
    assert "range(0, 3)" in boundary and ">= 0" in boundary and "max(" not in boundary
    # a long summation is clamped at the boundary (no masked trips over out-of-range taps)
    long_src = generate_source(ollie.parse("A: [64]\nL<i=0:64> Sum<k=0:17> A[i + k - 8]"))
    long_boundary = _loop_body(long_src, "# boundary")
    assert "max(" in long_boundary and "range(0, 17)" not in long_boundary
    check("A: [64]\nL<i=0:64> Sum<k=0:17> A[i + k - 8]")


@pytest.mark.timing
def test_disk_cache_is_reused_by_a_new_process(tmp_path):
    """A second process loads the generated module from the disk cache, and numba's machine
    code with it: it compiles nothing (numba's compilations counted, not timed)."""
    script = textwrap.dedent(f"""
        import json
        from numba.core import event
        from ollie.codegen.cpu import compile_cpu
        with event.install_recorder("numba:compile") as compiled:
            k = compile_cpu({OFFSET_ADD!r}, cache_dir={str(tmp_path)!r})
        print(json.dumps([k.from_disk, sum(e.is_start for _, e in compiled.buffer)]))
    """)

    def run() -> tuple[bool, int]:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        from_disk, compilations = json.loads(out.stdout.strip().splitlines()[-1])
        return from_disk, compilations

    first_disk, first_compiled = run()
    assert not first_disk and first_compiled >= 1
    assert list(tmp_path.glob("nests/__pycache__/*.nbi"))  # numba's code of its loop nests
    second_disk, second_compiled = run()
    assert second_disk and second_compiled == 0


@pytest.mark.parametrize("env, expected", [
    ({}, "omp"),  # Ollie's order: omp first (when numba can load it)
    ({"NUMBA_THREADING_LAYER": "workqueue"}, "workqueue"),  # the user's choice is kept
])
def test_threading_layer_choice(tmp_path, env, expected):
    script = textwrap.dedent(f"""
        import numpy as np, numba
        from ollie.codegen.cpu import compile_cpu
        big = "A: [1024, 1024]\\nL<i=0:1024, j=0:1024> A[i, j] * 2"
        k = compile_cpu(big, cache_dir={str(tmp_path)!r})
        a = np.ones((1024, 1024), np.float32)
        assert (k({{"A": a}}) == 2).all()
        try:
            import numba.np.ufunc.omppool  # noqa: F401
            omp = True
        except ImportError:
            omp = False
        print(numba.config.THREADING_LAYER_PRIORITY[0], numba.threading_layer(), omp)
    """)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr
    first, layer, omp = out.stdout.split()[-3:]
    if not env:  # Ollie set the order (with a user's choice, numba's own order stands)
        assert first == "omp"
    if expected == "omp" and omp == "False":
        pytest.skip("numba cannot load its omp threading layer here")
    assert layer == expected


# --------------------------------------------------------------------- calling convention
def test_calling_convention_and_errors():
    expr = ollie.parse("A: [2, 3]\nB: [5]\nL<i=0:2, j=0:3> A[i, j] + 1")
    k = compile_eop(expr, "cpu")
    assert compile_cpu(expr) is k and k.input_names == ("A",)
    a = np.ones((2, 3), np.float32)
    out = np.zeros((2, 3), np.float32)
    assert k({"A": a}, out) is out and (out == 2).all()
    assert (k({"A": np.ones((2, 3), np.float64)}) == 2).all()  # converted
    ro = np.ones((2, 3), np.float32)
    ro.flags.writeable = False
    assert (k({"A": ro}) == 2).all()
    with pytest.raises(ShapeError):
        k({})
    with pytest.raises(ShapeError):
        k({"A": np.ones((3, 2), np.float32)})
    with pytest.raises(ShapeError):
        k({"A": a}, np.zeros((2, 3), np.float64))
    ref = compile_eop(expr, "reference")
    np.testing.assert_array_equal(ref({"A": a}), k({"A": a}))
    with pytest.raises(UnsupportedError):
        compile_eop(expr, "tpu")


def test_unusable_cache_dir_falls_back_to_a_temporary_one(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    k = compile_cpu("A: [3]\nL<i=0:3> A[2 - i] * 7", cache_dir=blocker / "kernels")
    assert k.path.exists() and blocker not in k.path.parents
    np.testing.assert_array_equal(k({"A": np.arange(3, dtype=np.float32)}), [14, 7, 0])


# --------------------------------------------------------------------- residue split, tiling
@pytest.mark.parametrize("text", [
    # stride 2, 4x4 kernel, padding 1 (the InfoGAN selective add), odd spatial size
    """Y: [2, 2, 3, 5, 4, 4]
       L<n=0:2, c=0:5, h=0:4, w=0:5> Sum<y=0:2, x=0:3> Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]""",
    # stride 3, kernel 5, padding on both sides, traversal not starting at 0
    """Y: [3, 2, 5, 4]
       L<h=-2:7, c=0:4> Sum<y=0:3> Y[y, c % 2, h + 2 - 3*y, c] * 0.5""",
    # negated, positive stride coefficient, a summation range wider than the read's
    """Y: [3, 6, 2]
       L<h=0:8, c=0:2> Sum<y=-1:4> -Y[y, 2*y - h + 1, c]""",
    # coefficient of t not 1 (4 = 2 * 2): residues of 2
    """Y: [2, 9]
       L<h=0:5> Sum<y=0:2> Y[y, 2*h - 4*y + 1]""",
])
def test_residue_split_selective_adds(text):
    expr = ollie.parse(text)
    src = generate_source(expr, literal_sizes=True)
    assert "more residue nest" in src or "nest_1(" in src, src  # one function or several
    check(expr)


def test_residue_split_not_applied_without_implied_range():
    # y's range is narrower than the dimension it indexes: no split (still exact)
    text = "Y: [4, 6]\nL<h=0:4> Sum<y=1:3> Y[y, h + 1 - 2*y]"
    assert "residue" not in generate_source(ollie.parse(text))
    check(text)


def test_residue_split_applies_to_long_quotient_loops():
    # 14 values per residue class (a non-affine index in another dimension stays as written)
    text = """Y: [16, 14, 4]
        L<h=0:28> Sum<y=0:14> Y[h % 16, y, h + 1 - 2*y]"""
    src = generate_source(ollie.parse(text))
    assert "nest_1(" in src and "% 8" in src, src  # two residue nests; (2*hq + r) % 16
    check(text)


def test_a_residue_group_runs_in_parallel_when_its_nests_together_are_large_enough():
    # DCGAN b16's last selective add: each of the 4 residue nests has 196,608 points, under
    # PARALLEL_MIN_POINTS (2**18), the group's one loop 786,432: it must be a prange
    text = """T: [16, 32, 32, 3, 4, 4]
        L<n=0:16, c=0:3, h=0:64, w=0:64> Sum<y=0:32, x=0:32>
            T[n, y, x, c, h - 2*y + 1, w - 2*x + 1]"""
    src = generate_source(ollie.parse(text))
    assert "3 more residue nest" in src and "parallel=True" in src and "prange(" in src, src
    check(text)
    # a small group stays serial
    small = """T: [2, 4, 4, 3, 4, 4]
        L<n=0:2, c=0:3, h=0:8, w=0:8> Sum<y=0:4, x=0:4> T[n, y, x, c, h - 2*y + 1, w - 2*x + 1]"""
    src = generate_source(ollie.parse(small))
    assert "more residue nest" in src and "parallel=False" in src, src
    check(small)


@pytest.mark.parametrize("text", [
    "A: [2, 20, 3, 37]\nL<n=0:2, h=0:3, w=0:37, c=0:20> A[n, c, h, w]",
    "A: [3, 20, 18]\nL<n=0:3, t=1:19, c=0:20> A[n, c, t - 1]",
    # padding along the tiled iterator on both sides
    "A: [2, 17, 33]\nL<n=0:2, w=-2:35, c=0:17> A[n, c, w] * 2",
])
def test_transpose_is_tiled(text):
    expr = ollie.parse(text)
    assert "tiles of x" in generate_source(expr)
    check(expr)


@pytest.mark.parametrize("text", [
    # a residue-split outer nest reading a nested scope whose traversal starts at -1 (the
    # DCGAN / InfoGAN selective add after post-processing): the read's in-bounds indices are
    # [-1, 3), not [0, 4)
    """T: [2, 3, 4, 4, 4, 4]
       L<n=0:2, c=0:3, h=0:8, w=0:8> Sum<y=0:4> { L<n=0:2, c=0:3, t=-1:3, w=0:8, y=0:4>
           Sum<x=0:4> T[n, c, t + 1, w - 2*x + 1, y, x] }[n, c, h - 2*y, w, y]""",
    # stride 3 over a nested scope starting at -2 (and ending past the data)
    """T: [4, 3, 7]
       L<h=0:9, c=0:3> Sum<y=0:3> { L<t=-2:5, c=0:3> T[t + 2, c, t + 2] * 2 }[h - 3*y, c]""",
    # a nested scope starting at 2
    """T: [3, 10]
       L<h=0:8> Sum<y=0:3> { L<t=2:7> T[1, t + 3] }[h + 2 - 2*y]""",
])
def test_residue_split_reads_nested_scopes_with_offset_ranges(text):
    check(ollie.parse(text))


@pytest.mark.parametrize(("text", "inlined"), [
    # the Conv5x5 -> Conv3x3 sum over shifted rows: the re-indexing scope's range is exactly
    # where C is in bounds, so it is read inline (no temporary) and reads 0 outside
    ("""C: [2, 1, 5, 9, 7]
        L<n=0:2, f=0:1, h=0:9, w=0:7> Sum<r=0:5> { L<n=0:2, f=0:1, t=2:11, w=0:7, r=0:5>
            C[n, f, r, t - 2, w] }[n, f, h + r, w, r]""", True),
    # negative coefficient and a scale
    ("""C: [6, 4]
        L<h=0:8, c=0:4> Sum<r=0:3> { L<t=-5:1, c=0:4> C[-t, c] * 2 }[r - h, c]""", True),
    # the scope's range is narrower than where C is in bounds: must stay materialised
    ("""C: [10, 3]
        L<h=0:10, c=0:3> Sum<r=0:3> { L<t=1:8, c=0:3> C[t, c] }[h + r - 1, c]""", False),
    # not a single read (a sum of two): materialised
    ("""C: [10, 3]
        L<h=0:10, c=0:3> Sum<r=0:3> { L<t=0:10, c=0:3> C[t, c] + 1 }[h + r - 1, c]""", False),
])
def test_reindexing_scopes_over_padding_are_inlined_only_when_exact(text, inlined):
    expr = ollie.parse(text)
    assert ("tmp_0" not in generate_source(expr)) == inlined
    check(expr)


@pytest.mark.parametrize(("text", "inlined"), [
    # the scope's element t = 0 is an ordinary 0 (A[-1] inside the scope): 0 * NaN is NaN
    ("A: [4]\nB: [4]\nL<i=0:4> { L<t=0:4> A[t - 1] }[i] * B[i]", False),
    # its body is never a structural zero inside its ranges: inlined
    ("A: [4]\nB: [4]\nL<i=0:4> { L<t=0:4> A[t] * 2 }[i] * B[i]", True),
    # read in a sum, not a factor: inlined (its zeros only add)
    ("A: [4]\nB: [4]\nL<i=0:4> { L<t=0:4> A[t - 1] }[i] + B[i]", True),
])
def test_scopes_whose_zeros_would_annihilate_a_product_are_not_inlined(text, inlined):
    """An element of a nested scope is an ordinary value, a read of its body outside its
    tensor a structural zero: a scope read as a factor is inlined only where its body is
    never one, so NaN stays where the interpreter puts it."""
    expr = ollie.parse(text)
    assert (make_plan(expr).inlined == 1) == inlined
    a = np.arange(1.0, 5.0, dtype=np.float32)
    b = np.array([np.nan, 1.0, np.inf, 2.0], np.float32)
    got = check(expr, {"A": a, "B": b})
    assert np.isnan(got[0]) and np.isinf(got[2])
