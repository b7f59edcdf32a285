"""Candidate ranking: the roofline cost of kernels, library signatures, and the order in which
candidates are verified and reported (the cheapest of each signature first, programs of
eOperators only kept to one place for a compute-bound expression)."""

import math

import pytest

import ollie
from ollie.bench.cases import CASES, conv_text, to_conv3x3
from ollie.program.kernel import Kernel
from ollie.program.params import ConvParams, EOpParams, KernelKind, MatmulParams
from ollie.search.candidate import Candidate
from ollie.search.derive import compute_bound, rank
from ollie.search.instantiate import (
    EOP_SLOWDOWN,
    WINOGRAD_GAIN,
    Instantiator,
    kernel_cost,
    library_signature,
)
from ollie.testing.clock import stopped_clock
from ollie.tune.roofline import DEFAULT_ROOFLINE, Roofline


def _conv(r: int, s: int, d: int = 1) -> Kernel:
    p = ConvParams(n=1, c=32, h=14, w=14, f=32, r=r, s=s, ph=0, pw=0, sh=1, sw=1, dh=d, dw=d)
    return Kernel(KernelKind.CONV, p, ("A", "K"), "c", None)


def _eop(nbytes: int = 4096) -> Kernel:
    return Kernel(KernelKind.EOP, EOpParams(bytes=nbytes), ("A",), "e", None)


def _cand(cost: float, *kernels: Kernel) -> Candidate:
    return Candidate(list(kernels), "out", cost=cost)


def test_signature_tells_convolutions_and_products_apart():
    assert library_signature([_eop()]) == ()
    assert library_signature([_conv(3, 3), _eop(), _conv(3, 3)]) == \
        (("Conv", 3, 3, 1, 1, 1, 1),)
    assert library_signature([_conv(3, 3)]) != library_signature([_conv(3, 3, d=2)])
    assert library_signature([_conv(3, 3)]) != library_signature([_conv(5, 5)])
    batched = Kernel(KernelKind.MATMUL, MatmulParams(b=4, m=8, n=8, k=8), ("A", "B"), "m",
                     None)
    plain = Kernel(KernelKind.MATMUL, MatmulParams(b=1, m=8, n=8, k=8), ("A", "B"), "m", None)
    assert library_signature([batched]) != library_signature([plain])


def test_a_conv3x3_is_ranked_before_many_cheaper_finds():
    """A 5x5 list: 20 programs of eOperators only and 20 variants of the direct 5x5 Conv,
    all estimated cheaper than the one Conv3x3 program; the Conv3x3 program is still among the
    first candidates, and the eOperator programs keep one place after every signature (the
    others come after every library program)."""
    eops = [_cand(1e-6 * (1 + i), _eop(), _eop()) for i in range(20)]
    direct = [_cand(2e-6 * (1 + i), _eop(), _conv(5, 5), _eop()) for i in range(20)]
    tiled = _cand(1e-3, _eop(), _conv(3, 3), _eop())
    order = rank([*eops, *direct, tiled], compute_bound=True)
    assert order[:3] == [direct[0], tiled, eops[0]]
    assert order[3:] == direct[1:] + eops[1:]  # the other eOperator programs come last
    # for a memory-bound expression, programs of eOperators only are one signature among
    # the others: the cheapest of each first, then the rest by cost
    order = rank([*eops, *direct, tiled], compute_bound=False)
    assert order[:3] == [eops[0], direct[0], tiled]
    assert len(order) == 41


def test_kernel_cost_follows_the_roofline():
    expr = ollie.parse(CASES["conv3x3"].small)  # 16 channels, 7x7, a 3x3 Conv matches as is
    inst = Instantiator(("Conv",))
    conv = next(o.kernels[0] for o in inst.complete(expr) if len(o.kernels) == 1 and
                o.kernels[0].kind is KernelKind.CONV)
    roof = Roofline(peak_flops=1e9, bandwidth=1e9, launch_s=1e-3)
    flops = 2.0 * 16 * 16 * 7 * 7 * 9 / WINOGRAD_GAIN  # Winograd applies
    nbytes = 4.0 * (16 * 7 * 7 + 16 * 16 * 9 + 16 * 7 * 7)
    assert kernel_cost(conv, roof) == pytest.approx(1e-3 + max(flops / 1e9, nbytes / 1e9))
    assert kernel_cost(_eop(8000), roof) == pytest.approx(1e-3 + EOP_SLOWDOWN * 8000 / 1e9)
    # the options instantiation builds carry these costs (the default roofline when None)
    opt = next(o for o in Instantiator(("Conv",), roofline=roof).complete(expr)
               if len(o.kernels) == 1)
    assert opt.cost == pytest.approx(kernel_cost(opt.kernels[0], roof))
    assert kernel_cost(conv) == pytest.approx(kernel_cost(conv, DEFAULT_ROOFLINE))


def test_small_dimensions_cost_more_per_flop():
    """A product with 4 columns runs at a quarter of the peak rate (SMALL_DIM = 16)."""
    roof = Roofline(peak_flops=1e9, bandwidth=1e15, launch_s=0.0)
    wide = ollie.parse("A: [64, 64]\nB: [64, 64]\n"
                       "L<m=0:64, n=0:64> Sum<k=0:64> A[m, k] * B[k, n]\n")
    thin = ollie.parse("A: [64, 64]\nB: [64, 4]\n"
                       "L<m=0:64, n=0:4> Sum<k=0:64> A[m, k] * B[k, n]\n")
    costs = []
    for expr in (wide, thin):
        mm = next(o.kernels[0] for o in Instantiator(("Matmul",)).complete(expr)
                  if o.kernels[0].kind is KernelKind.MATMUL)
        costs.append(kernel_cost(mm, roof))
    assert costs[0] == pytest.approx(2 * 64 ** 3 / 1e9)
    assert costs[1] == pytest.approx(2 * 64 * 64 * 4 / (1e9 / 4))


def test_compute_bound_uses_the_ridge_point():
    expr = ollie.parse(conv_text(1, 16, 8, 8, 16, 3, 3, 1))
    assert compute_bound(expr, DEFAULT_ROOFLINE)
    assert not compute_bound(expr, Roofline(peak_flops=1e15, bandwidth=1e9, launch_s=0.0))


def test_every_signature_is_verified_before_a_second_best():
    """The reported list walks the rank order: a signature's second program comes only after
    the best of every signature found (the 5x5 case reports a Conv3x3 program within 8)."""
    expr = ollie.parse(CASES["conv5x5"].small)
    res = ollie.derive(expr, max_depth=1, time_budget=60.0, max_states=4, max_candidates=8,
                       clock=stopped_clock)
    sigs = [library_signature(c.kernels) for c in res.candidates]
    first_repeat = next((i for i, s in enumerate(sigs) if s in sigs[:i]), len(sigs))
    assert len(set(sigs[first_repeat:]) - set(sigs[:first_repeat])) == 0
    assert any(to_conv3x3(c) for c in res.candidates)
    assert all(c.verified for c in res.candidates)
    assert not math.isnan(res.candidates[0].cost)


def test_the_search_ranks_on_its_config_roofline():
    """``SearchConfig.roofline`` reaches the cost of every option and the compute-bound test:
    on a machine with an enormous peak rate the convolution is memory-bound, its programs of
    eOperators only are not held back, and the estimates are those of that roofline."""
    expr = ollie.parse(CASES["conv3x3"].small)
    roof = Roofline(peak_flops=1e15, bandwidth=1e9, launch_s=0.0)
    common = dict(max_depth=1, time_budget=60.0, max_states=3, max_candidates=64,
                  clock=stopped_clock)
    ours = ollie.derive(expr, roofline=roof, **common)
    default = ollie.derive(expr, **common)
    assert not compute_bound(expr, roof) and compute_bound(expr, DEFAULT_ROOFLINE)
    for res, r in ((ours, roof), (default, DEFAULT_ROOFLINE)):
        for c in res.candidates:
            assert c.cost == pytest.approx(sum(kernel_cost(k, r) for k in c.kernels
                                               if k.expr is not None))
    assert rank(ours.candidates, compute_bound=False) == ours.candidates
    assert rank(default.candidates, compute_bound=True) == default.candidates
