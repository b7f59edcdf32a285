"""Guided moves carry their rule applications as data: tiling a Conv kernel tap larger than
the fast algorithms' size is one move of two steps, summing the tile iterator the split made."""

from __future__ import annotations

import numpy as np

import ollie
from ollie.rules.variable_substitution import split_summation_iters
from ollie.search.guided import FAST_CONV_KERNEL, proposals
from ollie.search.instantiate import Instantiator

CONV6 = """X: [1, 2, 10, 10]
W: [2, 2, 6, 6]
L<n=0:1, f=0:2, h=0:5, w=0:5> Sum<c=0:2, r=0:6, s=0:6> X[n, c, h + r, w + s] * W[f, c, r, s]
"""


def test_split_summation_iters_returns_the_iterators_it_made():
    e = ollie.parse(CONV6)
    scope, q, r = split_summation_iters(e.root, "r", 3, e.inputs)
    assert (q.size, r.size) == (2, 3) and {q, r} <= set(scope.summation)
    assert not {q.name, r.name} & {it.name for it in e.root.summation}


def test_a_kernel_tiling_move_is_two_steps_and_stays_equivalent():
    e = ollie.parse(CONV6)
    inst = Instantiator(("Conv",))
    inst.complete(e)
    tiled = [p for p in proposals(e, inst) if p.steps and p.steps[0].note.startswith("tile")]
    assert tiled, "a 6x6 kernel is tiled toward the Conv target"
    for p in tiled:
        first, second = p.steps[0], p.steps[1]
        assert (first.rule, first.expr) == ("variable_substitution", "")
        assert first.note.endswith(f"by {FAST_CONV_KERNEL} (Conv target kernel)")
        assert (second.rule, second.note) == ("summation_splitting", "sum tiles outside")
        assert second.expr
        rng = np.random.default_rng(0)
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in e.inputs.items()}
        np.testing.assert_allclose(ollie.interpret(p.expr, feeds), ollie.interpret(e, feeds),
                                   rtol=1e-4, atol=1e-4)
