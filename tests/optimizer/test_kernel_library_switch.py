"""``OptimizeConfig.kernel_library`` and ``OptimizeConfig.derivation`` (the CLI's
``--no-kernel-library`` / ``--no-derivation``): a program optimised without the kernel library
never runs, and never names, one of Ollie's hand-written kernels; without derivation every
compute operator stays as it is; every combination computes what the model computes."""

from __future__ import annotations

import json

import pytest
import torch

import ollie
from ollie.cli import build_parser
from ollie.graph import COMPUTE_OPS
from ollie.optimizer.model import to_graph
from ollie.policy import ALL, HAND_WRITTEN, VENDOR_ONLY
from ollie.program.params import KernelKind, NodeParams
from ollie.testing.cnns import build

SIZE = 16
# one candidate per subprogram and half a second of search: subprograms still get derived
# candidates, compiled, verified and timed (as tests/e2e/test_cnn_architectures.py); no
# whole-program context step (tests/optimizer/test_context.py)
FAST = dict(time_budget=0.5, max_candidates=1, use_cache=False, settle=0.0, context=False)
POLICIES = {"(0) originals, vendor": dict(derivation=False, kernel_library=False),
            "(a) derived, vendor": dict(derivation=True, kernel_library=False),
            "(b) originals, library": dict(derivation=False, kernel_library=True),
            "(c) both": dict(derivation=True, kernel_library=True)}


def _raise(*args, **kwargs):
    raise AssertionError("a hand-written kernel ran with the kernel library off")


@pytest.fixture
def no_hand_written_kernels(monkeypatch):
    """Every entry point of Ollie's kernel library raises."""
    from ollie.kernels import band, blocked_gemm, pool, winograd

    for module, names in ((winograd, ("winograd_conv2d", "winograd_conv_transpose2d")),
                          (blocked_gemm, ("blocked_products", "grouped_products")),
                          (band, ("g2bmm", "gbmm")), (pool, ("max_pool_runner",))):
        for name in names:
            monkeypatch.setattr(module, name, _raise)


def _error(model: torch.nn.Module, opt, seed: int = 1) -> float:
    x = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        want = model(x)
        got = opt(x)
    return float((got - want).abs().max() / want.abs().max())


def test_vendor_only_program_names_and_runs_no_hand_written_kernel(no_hand_written_kernels,
                                                                   monkeypatch, tmp_path):
    # VGG: max pooling, 3x3 convolutions and Linear layers (a 32-column weight: a blocked
    # GEMM candidate with the kernel library on)
    model = build("vgg", w=8, size=SIZE)
    opt = ollie.optimize(model, (torch.randn(1, 3, SIZE, SIZE),), kernel_library=False,
                         **FAST)
    for k in opt.program.kernels:
        lib, region = k.params.library, k.params.region
        assert not any(h in str(lib or "") or h in str(region or "") for h in HAND_WRITTEN), k
    assert _error(model, opt) < 1e-3  # run outside optimize: still on vendor libraries
    assert opt.notes[0] == "kernel library off: vendor libraries only"
    # saved and loaded, it still runs on the vendor libraries only
    opt.save(tmp_path / "prog")
    again = ollie.load(tmp_path / "prog")
    assert again.implementations == VENDOR_ONLY
    assert _error(model, again, seed=2) < 1e-3
    report = tmp_path / "prog" / "report.json"
    doc = json.loads(report.read_text())
    report.write_text(json.dumps(dict(doc, implementations=["no such library"])))
    monkeypatch.undo()  # the kernel library back: the loaded program may now use it
    assert ollie.load(tmp_path / "prog").implementations == ALL  # the settings' (a warning)


@pytest.mark.parametrize("name", ["vgg", "squeezenet"])
def test_every_policy_computes_what_the_model_computes(name):
    model = build(name, w=8, size=SIZE)
    for label, flags in POLICIES.items():
        opt = ollie.optimize(model, (torch.randn(1, 3, SIZE, SIZE),), **FAST, **flags)
        assert _error(model, opt) < 1e-3, label
        assert any("checked against the original model" in n for n in opt.notes), label


def test_without_derivation_every_compute_operator_stays_original():
    model = build("vgg", w=8, size=SIZE)
    x = torch.randn(1, 3, SIZE, SIZE)
    graph = to_graph(model, (x,))
    opt = ollie.optimize(model, (x,), derivation=False, **FAST)
    compute = {n.name for n in graph.nodes if n.op in COMPUTE_OPS}
    kept = {k.params.node.name for k in opt.program.kernels
            if isinstance(k.params, NodeParams)}
    assert compute and compute <= kept
    assert not any(k.kind in (KernelKind.CONV, KernelKind.MATMUL, KernelKind.G2BMM,
                              KernelKind.GBMM) for k in opt.program.kernels)
    assert opt.report == []  # nothing searched
    assert opt.notes[0].startswith("derivation off")
    assert _error(model, opt) < 1e-3


def test_cli_flags_reach_optimize(optimize_cli_kwargs):
    args = build_parser().parse_args(["optimize", "zoo:srcnn"])
    assert args.kernel_library and args.derivation
    args = build_parser().parse_args(["optimize", "zoo:srcnn", "--no-kernel-library",
                                      "--no-derivation"])
    assert not args.kernel_library and not args.derivation
    seen = optimize_cli_kwargs(["optimize", "zoo:srcnn", "--no-kernel-library",
                                "--no-derivation"])
    assert seen["kernel_library"] is False and seen["derivation"] is False


def test_no_winograd_variant_of_a_program_without_the_kernel_library(ollie_settings):
    import numpy as np

    from ollie.graph import Node
    from ollie.optimizer.libraries import ONEDNN_WINOGRAD, WINOGRAD_ALL, variant
    from ollie.policy import VENDOR_ONLY
    from ollie.program.kernel import Kernel
    from ollie.program.program import Program

    node = Node("Conv2d", ("x", "w"), ("y",), {"padding": 1}, "c0")
    conv = Kernel(KernelKind.NODE, NodeParams(node=node, op="Conv2d"), ("x", "w"), "y", None,
                  (), (1, 64, 56, 56))
    prog = Program((("x", (1, 64, 56, 56)),), ("y",), [conv],
                   {"w": np.zeros((64, 64, 3, 3), np.float32)})
    winograd = variant(prog, WINOGRAD_ALL)
    assert winograd is not None and winograd.kernels[0].params.library == "Winograd"
    assert variant(prog, ONEDNN_WINOGRAD) is not None
    ollie_settings(implementations=VENDOR_ONLY)
    assert variant(prog, WINOGRAD_ALL) is None and variant(prog, ONEDNN_WINOGRAD) is None
    assert variant(prog, "oneDNN packed") is not None
