"""Products kept transposed (ollie.passes.orient): a Matmul whose output only eOperators read
computes C^T = B^T A^T and its readers index it transposed; the program computes the same
values (checked against the reference interpreter), and what does not qualify is left alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie.bench.cases import tconv_text
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.select import candidate_program, select, transposed_candidate
from ollie.passes.orient import TALL, TRANSPOSED, transposable, transposed_products
from ollie.program.kernel import Kernel
from ollie.program.program import Program
from ollie.semantics.check import random_inputs
from ollie.testing.clock import stopped_clock


def _matmul_candidates(expr):
    res = ollie.derive(expr, max_depth=2, time_budget=60.0, max_candidates=16, clock=stopped_clock)
    return [c for c in res.candidates
            if any(k.kind == "Matmul" for k in c.kernels) and
            all(k.kind in ("Matmul", "eOp") for k in c.kernels)]


def _run(prog: Program, inputs: dict) -> np.ndarray:
    feed = {n: inputs[n] for n, _ in prog.inputs}
    return CompiledProgram(prog).run(feed)[prog.outputs[0]].numpy()


@settings(max_examples=3, deadline=None)
@given(n=st.just(1), ci=st.integers(2, 9), h=st.just(2), co=st.integers(8, 10))
def test_a_transposed_convolution_as_a_transposed_product_matches_the_reference(n, ci, h, co):
    expr = ollie.parse(tconv_text(n, ci, h, co))
    inputs = random_inputs(expr, seed=3)
    want = ollie.interpret(expr, inputs)
    found = 0
    for cand in _matmul_candidates(expr):
        other = transposed_candidate(cand, expr)
        if other is None:
            continue
        found += 1
        assert other.derivation == [*cand.derivation, "data_layout_transformation"]
        np.testing.assert_allclose(other.run(inputs), want, rtol=1e-4, atol=1e-4)
        before = {k.output: k for k in cand.kernels}
        for k in other.kernels:
            if k.params.get(TRANSPOSED):
                old = before[k.output]
                # operands exchanged, m and n exchanged, the output dimensions permuted
                assert k.inputs == old.inputs[::-1]
                assert (k.params["m"], k.params["n"]) == (old.params["n"], old.params["m"])
                assert sorted(k.output_shape) == sorted(old.output_shape)
        # as the post-processed program the optimiser measures, too
        prog = candidate_program(other, expr, {})
        np.testing.assert_allclose(_run(prog, inputs), want, rtol=1e-4, atol=1e-4)
    # products of co * 16 rows (output channels times taps) and n * h * h columns (pixels)
    assert co * 16 >= TALL * n * h * h
    assert found, "no Matmul + eOperator candidate had a product to transpose"


def test_products_the_caller_or_a_library_reads_are_not_transposed():
    expr = ollie.parse(tconv_text(1, 6, 2, 8))
    cand = next(c for c in _matmul_candidates(expr) if transposed_candidate(c, expr))
    prog = Program(tuple(expr.decls), (cand.output,), list(cand.kernels), {})
    i = next(j for j, k in enumerate(prog.kernels) if transposable(prog, j))
    mm = prog.kernels[i]
    # the program returns the product: not transposed
    returned = Program(prog.inputs, (mm.output,), prog.kernels[:i + 1], {})
    assert not transposable(returned, i) and transposed_products(returned) is None
    # a library kernel reads it: not transposed
    reader = Kernel("Matmul", dict(mm.params), (mm.output, mm.inputs[1]), "y", mm.expr,
                    mm.views)
    read = Program(prog.inputs, ("y",), [*prog.kernels[:i + 1], reader], {})
    assert not transposable(read, i)
    # a product with fewer than TALL times more rows than columns (4 output channels x 16
    # taps against 4 pixels): not transposed
    short = ollie.parse(tconv_text(1, 6, 2, 4))
    assert TALL * 4 > 4 * 16
    products = [c for c in _matmul_candidates(short)
                if any(k.params.get("m") == 64 and k.params.get("n") == 4 for k in c.kernels)]
    assert products and all(transposed_candidate(c, short) is None for c in products)
    # already transposed: not again
    once = transposed_products(prog)
    assert once is not None and transposed_products(once) is None


def test_selection_measures_both_orientations():
    expr = ollie.parse(tconv_text(1, 8, 2, 8))
    inputs = random_inputs(expr, seed=1)
    cands = _matmul_candidates(expr)[:2]
    sel = select(expr, cands, lambda: None, inputs, rounds=3, max_seconds=2.0)
    labels = [m.label for m in sel.measured]
    assert any("products transposed" in lab for lab in labels)
    assert any("products transposed" not in lab for lab in labels)


def test_a_program_with_a_transposed_product_survives_save_and_load(tmp_path):
    expr = ollie.parse(tconv_text(1, 5, 2, 8))
    cand = next(t for c in _matmul_candidates(expr)
                if (t := transposed_candidate(c, expr)) is not None)
    inputs = random_inputs(expr, seed=5)
    weights = {n: v for n, v in inputs.items() if n != expr.decls[0][0]}
    prog = candidate_program(cand, expr, weights)
    assert any(k.params.get(TRANSPOSED) for k in prog.kernels)
    prog.save(tmp_path)
    loaded = Program.load(tmp_path)
    assert [k.params.get(TRANSPOSED) for k in loaded.kernels] == \
        [k.params.get(TRANSPOSED) for k in prog.kernels]
    np.testing.assert_allclose(_run(loaded, inputs), ollie.interpret(expr, inputs),
                               rtol=1e-4, atol=1e-4)
