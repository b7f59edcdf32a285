"""Property tests of the inter-expression rules on generated expressions."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.ir import Expr, verify
from ollie.rules.inter import expression_fusion, expression_merging, expression_splitting
from ollie.testing.strategies import exprs


def _inputs(expr, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40)
@given(exprs(depth=1), st.data())
def test_splitting_then_concatenating_is_exact(expr, data):
    dims = [i for i, it in enumerate(expr.root.traversal) if it.size > 1]
    if not dims:
        return
    dim = data.draw(st.sampled_from(dims))
    it = expr.root.traversal[dim]
    at = data.draw(st.integers(it.lo + 1, it.hi - 1))
    a, b = expression_splitting(expr, dim, at)
    verify(a)
    verify(b)
    inp = _inputs(expr)
    joined = np.concatenate([ollie.interpret(a, inp), ollie.interpret(b, inp)], axis=dim)
    np.testing.assert_allclose(joined, ollie.interpret(expr, inp), rtol=1e-6, atol=1e-6)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40)
@given(exprs(depth=1))
def test_merging_two_copies_over_different_tensors(expr):
    from hypothesis import assume

    from ollie.ir import Scope, accesses, tensor_names
    from ollie.optimizer.rename import rename_expr

    name = expr.decls[0][0]
    other = name + "2"
    assume(not any(name in tensor_names(a.source) for a in accesses(expr.root.body)
                   if isinstance(a.source, Scope)))
    twin = rename_expr(expr, {name: other})
    twin = Expr(tuple((n, s) for n, s in twin.decls), twin.root)
    merged = expression_merging(expr, twin, name, other)
    verify(merged)
    inp = _inputs(twin, seed=1)
    inp.update(_inputs(expr, seed=2))
    out = ollie.interpret(merged, inp)
    np.testing.assert_allclose(out[0], ollie.interpret(expr, inp), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1], ollie.interpret(twin, inp), rtol=1e-5, atol=1e-5)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40)
@given(exprs(depth=1), st.sampled_from(["relu({t}) * 2", "{t} + {t}", "tanh({t}) - 1"]))
def test_fusion_equals_running_producer_then_consumer(producer, body):
    shape = producer.shape
    idx = ", ".join(f"i{k}" for k in range(len(shape)))
    its = ", ".join(f"i{k}=0:{d}" for k, d in enumerate(shape))
    consumer = ollie.parse(f"T: [{', '.join(map(str, shape))}]\nL<{its}> "
                           + body.format(t=f"T[{idx}]"))
    fused = expression_fusion(consumer, "T", producer)
    verify(fused)
    inp = _inputs(producer)
    want = ollie.interpret(consumer, {"T": ollie.interpret(producer, inp)})
    np.testing.assert_allclose(ollie.interpret(fused, inp), want, rtol=1e-5, atol=1e-5)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40, deadline=None)
@given(exprs(depth=1), st.integers(2, 4), st.sampled_from([0, "inner"]), st.data())
def test_n_renamed_twins_merge_and_slice_back(expr, n, g_at, data):
    """N copies of an expression over renamed tensors merge into one; each slice of the merged
    result equals its copy's result, NaN and infinities included, for both placements of the
    new iterator."""
    from hypothesis import assume

    from ollie.ir import Scope, accesses, tensor_names
    from ollie.optimizer.rename import rename_expr
    from ollie.rules.inter import merge_expressions
    from ollie.testing.strategies import inputs_with_specials

    name = data.draw(st.sampled_from([n for n, _ in expr.decls]))
    assume(not any(name in tensor_names(a.source) for a in accesses(expr.root.body)
                   if isinstance(a.source, Scope)))
    taken = {n for n, _ in expr.decls}
    twins, holes = [expr], [(name,)]
    for i in range(1, n):
        other = f"{name}_twin{i}"
        assert other not in taken
        twins.append(rename_expr(expr, {name: other}))
        holes.append((other,))
    merged, slices = merge_expressions(twins, holes, g_at)
    verify(merged)
    assert len(slices) == n
    inp = data.draw(inputs_with_specials(merged))
    out = ollie.interpret(merged, inp)
    for twin, sl in zip(twins, slices, strict=True):
        verify(sl)
        assert sl.shape == twin.shape
        got = ollie.interpret(sl, {"merged": out})
        np.testing.assert_allclose(got, ollie.interpret(twin, inp), rtol=1e-5, atol=1e-5)
