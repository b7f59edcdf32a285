"""The evaluation models: they build deterministically, run, and have MODELS.md's shapes."""

from __future__ import annotations

import pytest
import torch

import ollie.zoo as zoo
from ollie.errors import OllieError
from ollie.zoo.gcn import GCN
from ollie.zoo.generators import CSRNetBackend
from ollie.zoo.resnet import ResNet18

SMALL_LONGFORMER = {"seq": 256, "width": 16}

EXPECTED = {
    "infogan": ((1, 228, 1, 1), (1, 3, 32, 32)),
    "dcgan": ((1, 100, 1, 1), (1, 3, 64, 64)),
    "srcnn": ((1, 1, 224, 224), (1, 1, 224, 224)),
    "gcn": ((1, 3, 224, 224), (1, 21, 224, 224)),
    "resnet18": ((1, 3, 224, 224), (1, 1000)),
    "csrnet": ((1, 512, 14, 14), (1, 64, 14, 14)),
    "longformer": ((1, 256, 512), (1, 256, 512)),
}


def _options(name: str) -> dict:
    return SMALL_LONGFORMER if name == "longformer" else {}


def test_names() -> None:
    assert zoo.NAMES == ("infogan", "dcgan", "srcnn", "gcn", "resnet18", "csrnet",
                         "longformer")
    for name, spec in zoo.MODELS.items():
        assert spec.name == name and spec.description


@pytest.mark.parametrize("name", list(EXPECTED))
def test_build_and_run(name: str) -> None:
    module, inputs = zoo.get(name, batch=1, **_options(name))
    assert not module.training
    (x,) = inputs
    in_shape, out_shape = EXPECTED[name]
    assert tuple(x.shape) == in_shape
    assert zoo.MODELS[name].input_shape(1, **_options(name)) == in_shape
    assert zoo.MODELS[name].output_shape(1, **_options(name)) == out_shape
    with torch.no_grad():
        y = module(x)
    assert tuple(y.shape) == out_shape
    assert torch.isfinite(y).all()
    assert 0.05 < float(y.std()) < 20.0  # activations stay O(1)


def test_structure_counts() -> None:
    gcn = GCN()  # structure only: no calibration needed
    kinds = [type(m).__name__ for m in gcn.modules()]
    assert kinds.count("Bottleneck") == 16  # 3 + 4 + 6 + 3
    assert kinds.count("GCNBlock") == 4 and kinds.count("BoundaryRefine") == 9
    assert kinds.count("ConvTranspose2d") == 5
    resnet = ResNet18()
    kinds = [type(m).__name__ for m in resnet.modules()]
    assert kinds.count("BasicBlock") == 8 and kinds.count("BatchNorm2d") == 20
    csr = CSRNetBackend()
    convs = [m for m in csr.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [
        (512, 512), (512, 512), (512, 512), (512, 256), (256, 128), (128, 64)]
    assert all(c.bias is None and c.dilation == (2, 2) and c.padding == (2, 2) for c in convs)


def test_deterministic_and_batch_independent_weights() -> None:
    a, (xa,) = zoo.get("infogan", batch=1)
    b, (xb,) = zoo.get("infogan", batch=3)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)
    assert tuple(xb.shape) == (3, 228, 1, 1)
    _, (xc,) = zoo.get("infogan", batch=1)
    assert torch.equal(xa, xc)
    state = torch.random.get_rng_state()
    zoo.get("csrnet")
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched


def test_batch16_shapes() -> None:
    module, (x,) = zoo.get("dcgan", batch=16)
    with torch.no_grad():
        assert tuple(module(x).shape) == (16, 3, 64, 64)


def test_longformer_options() -> None:
    module, (x,) = zoo.get("longformer", batch=2, seq=40, width=3, dilation=2)
    assert module.width == 3 and module.dilation == 2
    with torch.no_grad():
        assert tuple(module(x).shape) == (2, 40, 512)
    assert zoo.MODELS["longformer"].options == {"seq": 10000, "width": 1000, "dilation": 4}


def test_errors() -> None:
    with pytest.raises(OllieError, match="unknown zoo model 'vgg'"):
        zoo.get("vgg")
    with pytest.raises(OllieError, match="unknown option"):
        zoo.get("resnet18", seq=3)
    with pytest.raises(OllieError, match="batch"):
        zoo.get("srcnn", batch=0)
    assert zoo.get("zoo:csrnet")[1][0].shape == (1, 512, 14, 14)


SMALL_BERT = {"seq": 32, "hidden": 64, "heads": 4, "ffn": 128}


def test_transformer_extras_are_models_but_not_paper_names() -> None:
    assert {"bert", "longformer_plain"} <= set(zoo.MODELS)
    assert not {"bert", "longformer_plain"} & set(zoo.NAMES)
    assert zoo.MODELS["bert"].options == {"seq": 128, "hidden": 768, "heads": 12, "ffn": 3072}
    assert zoo.MODELS["longformer_plain"].options == {"seq": 1024, "width": 64, "dilation": 4}


def test_bert_layer_builds_and_stays_order_one() -> None:
    module, (x,) = zoo.get("bert", batch=2, **SMALL_BERT)
    assert tuple(x.shape) == (2, 32, 64) == zoo.MODELS["bert"].output_shape(2, **SMALL_BERT)
    with torch.no_grad():
        y = module(x)
    assert tuple(y.shape) == (2, 32, 64)
    assert torch.isfinite(y).all() and 0.05 < float(y.std()) < 20.0
    kinds = [type(m).__name__ for m in module.modules()]
    assert kinds.count("Linear") == 6 and kinds.count("LayerNorm") == 2


@pytest.mark.parametrize(("seq", "width", "dilation"), [(40, 3, 2), (17, 2, 3), (9, 4, 1)])
def test_plain_longformer_computes_the_custom_band_ops(seq: int, width: int,
                                                       dilation: int) -> None:
    opts = {"seq": seq, "width": width, "dilation": dilation}
    custom, (x,) = zoo.get("longformer", batch=2, **opts)
    plain, (xp,) = zoo.get("longformer_plain", batch=2, **opts)
    assert torch.equal(x, xp)
    for (na, pa), (nb, pb) in zip(custom.state_dict().items(), plain.state_dict().items(),
                                  strict=True):
        assert na == nb and torch.equal(pa, pb)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), custom(x), rtol=1e-5, atol=1e-5)


def test_plain_band_ops_match_the_references() -> None:
    from ollie.zoo.longformer import g2bmm_torch, gbmm_torch
    from ollie.zoo.ops import g2bmm_reference, gbmm_reference

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 11, 5, generator=gen) for _ in range(3))
    s = g2bmm_torch(q, k, 2, 3)
    torch.testing.assert_close(s, g2bmm_reference(q, k, 2, 3))
    torch.testing.assert_close(gbmm_torch(s, v, 2, 3), gbmm_reference(s, v, 2, 3))
