"""Expression merging by concatenation with summation relaxation
(:func:`ollie.rules.inter_merge.concat_merge`): before / after examples in the text syntax,
hypothesis properties (every slice equals its member on finite inputs), and what relaxation
does with an infinity in the shared operand (its documented contract)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.errors import ExprError
from ollie.ir import verify
from ollie.rules.inter_merge import concat_merge, relax_expression
from ollie.testing.strategies import inputs_with_specials

MATMUL = "A: [4, 6]\n{w}: [6, {n}]\nL<m=0:4, n=0:{n}> Sum<k=0:6> A[m, k] * {w}[k, n]"
CONV = ("X: [1, 4, 6, 6]\n{w}: [{f}, 4, {k}, {k}]\n"
        "L<n=0:1, f=0:{f}, h=0:6, w=0:6> Sum<c=0:4, r=0:{k}, s=0:{k}> "
        "X[n, c, h + r - {p}, w + s - {p}] * {w}[f, c, r, s]")


def _inputs(expr, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}


def _check(cm, exprs, inputs=None, rtol=1e-5):
    verify(cm.merged)
    inp = inputs or _inputs(cm.merged)
    out = ollie.interpret(cm.merged, inp)
    for e, sl in zip(exprs, cm.slices, strict=True):
        verify(sl)
        np.testing.assert_allclose(ollie.interpret(sl, {"merged": out}),
                                   ollie.interpret(e, inp), rtol=rtol, atol=1e-5)


def test_two_matmuls_with_different_n_concatenate():
    exprs = [ollie.parse(MATMUL.format(w="W0", n=2)), ollie.parse(MATMUL.format(w="W1", n=3))]
    cm = concat_merge(exprs, [("W0",), ("W1",)])
    assert ollie.format(cm.merged).splitlines()[-1] == (
        "L<m=0:4, n=0:5> Sum<k=0:6> A[m, k] * { L<d0=0:6, d1=0:5> "
        "{ L<d0=0:6, d1=0:2> W0[d0, d1] }[d0, d1] + "
        "{ L<d0=0:6, d1=2:5> W1[d0, d1 - 2] }[d0, d1] }[k, n]")
    assert [ollie.format(s).splitlines()[-1] for s in cm.slices] == [
        "L<t0=0:4, t1=0:2> merged[t0, t1]", "L<t0=0:4, t1=0:3> merged[t0, t1 + 2]"]
    assert (cm.axis, cm.iterator, cm.offsets, cm.relaxed) == (1, "n", (0, 2), ())
    assert cm.growth == 1.0
    _check(cm, exprs)


def test_squeezenet_expand_pair_concatenates_and_relaxes():
    """A 1x1 conv (2 channels) next to a 3x3 pad-1 conv (3 channels): the 1x1 weight is
    shifted to the centre tap of the 3x3 window and zero elsewhere."""
    exprs = [ollie.parse(CONV.format(w="E1", f=2, k=1, p=0)),
             ollie.parse(CONV.format(w="E3", f=3, k=3, p=1))]
    cm = concat_merge(exprs, [("E1",), ("E3",)])
    assert ollie.format(cm.merged).splitlines()[-1] == (
        "L<n=0:1, f=0:5, h=0:6, w=0:6> Sum<c=0:4, r=0:3, s=0:3> "
        "X[n, c, h + r - 1, w + s - 1] * "
        "{ L<d0=0:5, d1=0:4, d2=0:3, d3=0:3> "
        "{ L<d0=0:2, d1=0:4, d2=1:2, d3=1:2> E1[d0, d1, d2 - 1, d3 - 1] }[d0, d1, d2, d3] + "
        "{ L<d0=2:5, d1=0:4, d2=0:3, d3=0:3> E3[d0 - 2, d1, d2, d3] }[d0, d1, d2, d3] "
        "}[f, c, r, s]")
    assert cm.note == "concat along f (offsets 0, 2), relaxed r, s"
    assert cm.growth == pytest.approx(9 * 5 / (1 * 2 + 9 * 3))  # 3x3 over 5 channels
    _check(cm, exprs)
    # the order of the members does not matter: the hull starts where the 3x3 window does
    cm2 = concat_merge(exprs[::-1], [("E3",), ("E1",)])
    assert cm2.merged.root.summation == cm.merged.root.summation
    _check(cm2, exprs[::-1])


def test_without_relaxation_different_windows_do_not_merge():
    exprs = [ollie.parse(CONV.format(w="E1", f=2, k=1, p=0)),
             ollie.parse(CONV.format(w="E3", f=3, k=3, p=1))]
    with pytest.raises(ExprError, match="relaxation off"):
        concat_merge(exprs, [("E1",), ("E3",)], relax=False)


@pytest.mark.parametrize("other", [
    # the output iterator also indexes the shared operand: not a concatenation
    "A: [4, 6]\nW1: [6, 4]\nL<m=0:4, n=0:4> Sum<k=0:6> A[n, k] * W1[k, n]",
    # another function
    "A: [4, 6]\nW1: [6, 3]\nL<m=0:4, n=0:3> Sum<k=0:6> A[m, k] + W1[k, n]",
    # two output extents differ
    "A: [5, 6]\nW1: [6, 3]\nL<m=0:5, n=0:3> Sum<k=0:6> A[m, k] * W1[k, n]",
])
def test_what_does_not_concatenate(other):
    with pytest.raises(ExprError):
        concat_merge([ollie.parse(MATMUL.format(w="W0", n=2)), ollie.parse(other)],
                     [("W0",), ("W1",)])


def test_conv_strides_must_agree():
    """A 1x1 stride-1 conv and a 3x3 stride-2 conv read the input differently."""
    one = ollie.parse("X: [1, 2, 8, 8]\nW0: [3, 2, 1, 1]\nL<n=0:1, f=0:3, h=0:4, w=0:4> "
                      "Sum<c=0:2, r=0:1, s=0:1> X[n, c, h + r, w + s] * W0[f, c, r, s]")
    two = ollie.parse("X: [1, 2, 8, 8]\nW1: [3, 2, 3, 3]\nL<n=0:1, f=0:3, h=0:4, w=0:4> "
                      "Sum<c=0:2, r=0:3, s=0:3> X[n, c, 2*h + r - 1, 2*w + s - 1] * "
                      "W1[f, c, r, s]")
    with pytest.raises(ExprError):
        concat_merge([one, two], [("W0",), ("W1",)])


def _conv(i, f, kh, kw, stride, dil, bias):
    """A 'same' convolution (odd kernel kh x kw) of X [1, 3, 7, 7], with a bias scope."""
    ph, pw = dil * (kh - 1) // 2, dil * (kw - 1) // 2
    ho = (7 + 2 * ph - dil * (kh - 1) - 1) // stride + 1
    wo = (7 + 2 * pw - dil * (kw - 1) - 1) // stride + 1
    conv = (f"L<n=0:1, f=0:{f}, h=0:{ho}, w=0:{wo}> Sum<c=0:3, r=0:{kh}, s=0:{kw}> "
            f"X[n, c, {stride}*h + {dil}*r - {ph}, {stride}*w + {dil}*s - {pw}] * "
            f"W{i}[f, c, r, s]")
    decls = f"X: [1, 3, 7, 7]\nW{i}: [{f}, 3, {kh}, {kw}]\n"
    if bias:
        body = f"L<n=0:1, f=0:{f}, h=0:{ho}, w=0:{wo}> {{ {conv} }}[n, f, h, w] + B{i}[f]"
        return ollie.parse(decls + f"B{i}: [{f}]\n" + body), (f"W{i}", f"B{i}")
    return ollie.parse(decls + conv), (f"W{i}",)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40, deadline=None)
@given(st.integers(2, 4), st.data())
def test_matmuls_differing_in_one_extent_concatenate(n, data):
    """N Matmul-like expressions (a nested scope and an element-wise function included) with
    different output extents: every slice equals its member."""
    body = data.draw(st.sampled_from([
        "A[b, m, k] * {w}[k, o]", "relu(A[b, m, k]) * {w}[o, k]",
        "A[b, m, k] * {w}[k, o] * {w}[k, o]", "-(A[b, m, k] * {w}[k, o])"]))
    at = data.draw(st.sampled_from(["L<b=0:2, m=0:3, o=0:{n}>", "L<o=0:{n}, b=0:2, m=0:3>"]))
    exprs, holes = [], []
    for i in range(n):
        size = data.draw(st.integers(1, 4))
        w = f"W{i}"
        shape = "4, {n}" if "[k, o]" in body else "{n}, 4"
        text = (f"A: [2, 3, 4]\n{w}: [{shape.format(n=size)}]\n" + at.format(n=size)
                + " Sum<k=0:4> " + body.format(w=w))
        exprs.append(ollie.parse(text))
        holes.append((w,))
    cm = concat_merge(exprs, holes)
    assert cm.relaxed == () and cm.iterator == "o"
    assert cm.merged.shape[cm.axis] == sum(e.shape[cm.axis] for e in exprs)
    _check(cm, exprs)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=30, deadline=None)
@given(st.integers(2, 3), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.booleans(),
       st.data())
def test_convolutions_with_different_kernels_relax_and_concatenate(n, stride, dil, bias, data):
    """Convolutions of one input with equal stride and dilation, kernels 1x1 / 3x3 / 1x3 /
    3x1 / 5x5 and any channel counts: exact on finite inputs."""
    kernels = data.draw(st.lists(st.sampled_from([(1, 1), (3, 3), (1, 3), (3, 1), (5, 5)]),
                                 min_size=n, max_size=n))
    members = [_conv(i, data.draw(st.integers(1, 3)), kh, kw, stride, dil, bias)
               for i, (kh, kw) in enumerate(kernels)]
    exprs = [e for e, _ in members]
    cm = concat_merge(exprs, [h for _, h in members])
    assert cm.iterator == "f"
    hull = {it.name: it.size for it in cm.merged.root.summation} if not bias else None
    if hull is not None:
        assert (hull["r"], hull["s"]) == (max(k for k, _ in kernels), max(k for _, k in kernels))
    _check(cm, exprs, rtol=1e-4)


def test_relaxation_with_an_infinity_in_the_activation():
    """The contract: the merged expression reads the padded weights as one constant scope,
    whose zeros are ordinary values, so an infinity inside the hull but outside the 1x1's own
    window makes that output NaN where the 1x1 member is finite. The 3x3 member (its own window
    is the hull) and pure concatenation stay exact; the relaxed member on its own
    (:func:`relax_expression`, padding as a structural zero) is exact with the infinity."""
    exprs = [ollie.parse(CONV.format(w="E1", f=2, k=1, p=0)),
             ollie.parse(CONV.format(w="E3", f=3, k=3, p=1))]
    cm = concat_merge(exprs, [("E1",), ("E3",)])
    inp = _inputs(cm.merged)
    inp["X"][0, 1, 2, 3] = np.inf
    out = ollie.interpret(cm.merged, inp)
    one = ollie.interpret(exprs[0], inp)
    got = ollie.interpret(cm.slices[0], {"merged": out})
    window = np.zeros((6, 6), bool)
    window[1:4, 2:5] = True  # outputs whose 3x3 window holds X[.., 2, 3]
    centre = np.zeros((6, 6), bool)
    centre[2, 3] = True
    assert np.isinf(one[0, :, centre]).all() and np.isfinite(one[0, :, ~centre]).all()
    assert np.isnan(got[0, :, window & ~centre]).all()  # the documented difference
    np.testing.assert_allclose(got[0, :, ~window], one[0, :, ~window], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ollie.interpret(cm.slices[1], {"merged": out}),
                                  ollie.interpret(exprs[1], inp))
    relaxed = relax_expression(exprs[0], {"r": (0, 3), "s": (0, 3)}, ("E1",),
                               {"r": 1, "s": 1})
    verify(relaxed)
    np.testing.assert_array_equal(ollie.interpret(relaxed, inp), one)


def test_relax_expression_needs_a_hole_factor():
    e = ollie.parse("X: [6]\nW: [1]\nL<h=0:4> Sum<r=0:1> X[h + r] + W[r]")
    with pytest.raises(ExprError, match="factor"):
        relax_expression(e, {"r": (0, 3)}, ("W",))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=30, deadline=None)
@given(st.sampled_from([(1, 1), (1, 3), (3, 1), (3, 3)]), st.sampled_from([1, 2]),
       st.sampled_from([1, 2]), st.integers(1, 2), st.data())
def test_one_relaxed_member_is_exact_with_nan_and_infinities(kernel, stride, dil, grow, data):
    """A convolution relaxed on its own to a window ``grow`` taps larger on each side: its
    padding is a structural zero, so NaN and infinities reach exactly the outputs they reach
    in the original (exact for every input)."""
    kh, kw = kernel
    expr, holes = _conv(0, 2, kh, kw, stride, dil, False)
    hull = {"r": (0, kh + 2 * grow), "s": (0, kw + 2 * grow)}
    relaxed = relax_expression(expr, hull, holes, {"r": grow, "s": grow})
    verify(relaxed)
    inp = data.draw(inputs_with_specials(expr))
    np.testing.assert_array_equal(ollie.interpret(relaxed, inp), ollie.interpret(expr, inp))
