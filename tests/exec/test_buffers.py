"""Output buffers are reused across calls only once the caller has released them."""

from __future__ import annotations

import gc

import numpy as np
import torch

import ollie
from ollie.exec.buffers import BufferCache
from ollie.exec.executor import CompiledProgram
from ollie.testing.clock import stopped_clock


def test_buffer_cache_hands_out_only_released_arrays():
    cache = BufferCache(per_shape=2)
    a = cache.get((3, 4))
    b = cache.get((3, 4))
    assert a.data_ptr() != b.data_ptr()
    view = a[1:]
    del a
    c = cache.get((3, 4))  # a's array is still used by the view
    assert c.data_ptr() not in (view.data_ptr() - 16, b.data_ptr())
    del view
    gc.collect()
    d = cache.get((3, 4))
    assert cache.reused == 1 and d.shape == (3, 4)
    assert cache.get((5,)).shape == (5,)


def test_program_results_kept_by_the_caller_are_not_overwritten():
    expr = ollie.parse("Q: [2, 40, 8]\nK: [2, 40, 8]\n"
                       "L<b=0:2, i=0:40, j=0:9> Sum<k=0:8> Q[b, i, k] * K[b, i + 3*j - 12, k]")
    res = ollie.derive(expr, max_depth=1, time_budget=20, clock=stopped_clock)
    rng = np.random.default_rng(0)
    prog = next(c for c in res.candidates if any(k.kind == "G2BMM" for k in c.kernels))
    from ollie.optimizer.select import candidate_program

    program = candidate_program(prog, expr, {})
    compiled = CompiledProgram(program)
    feeds = [{n: torch.from_numpy(rng.standard_normal(s).astype(np.float32))
              for n, s in expr.decls} for _ in range(3)]
    wants = [ollie.interpret(expr, {n: t.numpy() for n, t in f.items()}) for f in feeds]
    outs = [compiled.run(f)[program.outputs[0]] for f in feeds]  # all kept
    for got, want in zip(outs, wants, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    ptrs = {o.data_ptr() for o in outs}
    assert len(ptrs) == 3
    del outs, got
    gc.collect()
    again = compiled.run(feeds[0])[program.outputs[0]]
    np.testing.assert_allclose(again.numpy(), wants[0], rtol=1e-4, atol=1e-4)
    assert compiled.buffers is not None and compiled.buffers.reused >= 1
