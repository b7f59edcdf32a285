"""A residual addition is folded into a library ``Conv`` kernel only when the residual tensor has
the convolution's own ``[n, f, ho, wo]`` shape. Found by the graph fuzzer: a linear layer
with a skip connection (``linear(x) + x``, x ``[2, 196]``) derived as a 1x1 ``Conv`` kernel
reading x as ``[2, 196, 1, 1]``; the addition was folded into it with x as the residual, and
oneDNN's fused add of a ``[2, 196]`` tensor to a ``[2, 196, 1, 1]`` output raised
``RuntimeError: Binary Fusion's inputs should have same dimensions`` while optimising."""

import numpy as np
import torch

import ollie
from ollie.exec.executor import CompiledProgram
from ollie.passes.postprocess import postprocess
from ollie.program.kernel import Kernel
from ollie.program.program import Program

LINEAR = "A: [2, 196]\nK: [196, 196]\nL<i=0:2, j=0:196> Sum<k=0:196> A[i, k] * K[j, k]"


def test_a_residual_of_another_shape_is_not_folded_into_a_library_conv() -> None:
    expr = ollie.parse(LINEAR)
    res = ollie.derive(expr, max_depth=1, time_budget=5)
    cand = next(c for c in res.candidates if [k.kind for k in c.kernels] == ["Conv"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 196)).astype(np.float32)
    w = rng.standard_normal((196, 196)).astype(np.float32) / 14
    add = ollie.parse("Y: [2, 196]\nA: [2, 196]\n"
                      "L<i=0:2, j=0:196> Y[i, j] + A[i, j]")
    add = ollie.parse(str(add).replace("Y", cand.output))
    kernels = [*cand.kernels, Kernel("eOp", {"expr": str(add)}, (cand.output, "A"), "out", add)]
    prog = Program((("A", (2, 196)),), ("out",), kernels, {"K": w})
    post = postprocess(prog)
    assert not any(k.kind == "Conv" and k.params.get("residual") for k in post.kernels)
    got = CompiledProgram(post).run({"A": x})["out"]
    want = torch.from_numpy(x @ w.T + x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
