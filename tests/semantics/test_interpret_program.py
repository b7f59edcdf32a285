"""Expression programs (:class:`ExprProgram`): structure checks, canonical names, fingerprints,
and their meaning (:func:`interpret_program`), here for three Matmuls merged and sliced back."""

import numpy as np
import pytest

import ollie
from ollie.errors import ExprError, ShapeError
from ollie.fingerprint import program_fingerprint
from ollie.ir.exprprogram import ExprProgram
from ollie.rules.inter import merge_expressions
from ollie.semantics.program import interpret_program

QKV = "A: [2, 4]\n{w}: [4, 3]\nL<m=0:2, n=0:3> Sum<k=0:4> A[m, k] * {w}[k, n]"


def _merged_program(names=("Wq", "Wk", "Wv"), outs=("q", "k", "v")):
    exprs = [ollie.parse(QKV.format(w=w)) for w in names]
    merged, slices = merge_expressions(exprs, [(w,) for w in names], "inner")
    defs = [("m", merged), *((o, ollie.ir.rename_expr(s, {"merged": "m"}))
                             for o, s in zip(outs, slices, strict=True))]
    inputs = (("A", (2, 4)), *((w, (4, 3)) for w in names))
    return ExprProgram(inputs, tuple(defs), outs), exprs


def test_interpret_program_equals_each_member():
    ep, exprs = _merged_program()
    ep.verify()
    rng = np.random.default_rng(0)
    inp = {n: rng.standard_normal(s).astype(np.float32) for n, s in ep.inputs}
    out = interpret_program(ep, inp)
    assert list(out) == ["q", "k", "v"]
    for name, e in zip(out, exprs, strict=True):
        np.testing.assert_allclose(out[name], ollie.interpret(e, inp), rtol=1e-5, atol=1e-6)
    pos = np.array([[0, 1], [1, 2]])
    at = interpret_program(ep, inp, at={"k": pos})
    np.testing.assert_allclose(at["k"], out["k"][tuple(pos.T)], rtol=1e-6)
    with pytest.raises(ShapeError, match="Wk"):
        interpret_program(ep, {**inp, "Wk": np.zeros((3, 4), np.float32)})


def test_fingerprint_and_canonical_names():
    ep, _ = _merged_program()
    other, _ = _merged_program(outs=("a", "b", "c"))
    assert program_fingerprint(ep) == program_fingerprint(other)  # def names do not matter
    swapped = ExprProgram(ep.inputs, ep.defs, ("k", "q", "v"))
    assert program_fingerprint(swapped) != program_fingerprint(ep)
    canon, names = ep.canonical()
    canon.verify()
    assert [n for n, _ in canon.inputs] == ["x0", "x1", "x2", "x3"]
    assert canon.outputs == ("y1", "y2", "y3") and names["A"] == "x0"
    assert canon.renamed({v: k for k, v in names.items()}) == ep


def test_verify_refuses_malformed_programs():
    ep, _ = _merged_program()
    with pytest.raises(ExprError, match="neither an input"):
        ExprProgram(ep.inputs, ep.defs[1:], ep.outputs).verify()
    with pytest.raises(ExprError, match="defined twice"):
        ExprProgram(ep.inputs, (*ep.defs, ep.defs[1]), ep.outputs).verify()
    with pytest.raises(ExprError, match="not defs"):
        ExprProgram(ep.inputs, ep.defs, ("z",)).verify()
    bad = ExprProgram((("A", (2, 5)), *ep.inputs[1:]), ep.defs, ep.outputs)
    with pytest.raises(ExprError, match="declares 'A'"):
        bad.verify()
