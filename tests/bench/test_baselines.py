"""The plain-PyTorch G2BMM formulations the operator benchmark compares with compute G2BMM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ollie
from ollie.bench.baselines import best_of, g2bmm_formulations


@pytest.mark.parametrize(("b", "m", "kd", "w", "d"), [(2, 37, 5, 3, 2), (1, 50, 4, 6, 4),
                                                       (3, 20, 3, 1, 1), (2, 9, 2, 5, 3)])
def test_g2bmm_formulations_match_the_interpreter(b, m, kd, w, d):
    expr = ollie.parse(f"Q: [{b}, {m}, {kd}]\nK: [{b}, {m}, {kd}]\n"
                       f"L<b=0:{b}, i=0:{m}, j=0:{2 * w + 1}> Sum<k=0:{kd}> "
                       f"Q[b, i, k] * K[b, i + {d}*j - {d * w}, k]")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, m, kd)).astype(np.float32)
    k = rng.standard_normal((b, m, kd)).astype(np.float32)
    want = ollie.interpret(expr, {"Q": q, "K": k})
    forms = g2bmm_formulations(torch.from_numpy(q), torch.from_numpy(k), w, d, tiles=(4, 7, 64))
    assert any(name.startswith("blocked") for name in forms)
    for name, fn in forms.items():
        np.testing.assert_allclose(fn().numpy(), want, rtol=1e-4, atol=1e-5, err_msg=name)
    label, fn = best_of(forms)
    assert label in forms and fn is forms[label]
