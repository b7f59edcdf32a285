"""``tv:NAME`` / ``hf:NAME`` models (ollie.zoo.external): built with seeded random weights,
clear errors for unknown names, options and missing libraries. The tests of the models
themselves skip where the optional libraries are not installed."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

import ollie.zoo
from ollie.errors import OllieError
from ollie.zoo import external

HAS_TV = importlib.util.find_spec("torchvision") is not None
HAS_HF = importlib.util.find_spec("transformers") is not None


def test_unknown_prefix_and_options_are_named():
    with pytest.raises(OllieError, match="not a tv:NAME"):
        external.build("xx:model")
    with pytest.raises(OllieError, match=r"unknown option.*allowed: size"):
        external.build("tv:resnet18", width=3)
    with pytest.raises(OllieError, match="unknown model"):
        external.build("hf:gpt99")


def test_missing_library_says_what_to_install(monkeypatch):
    real = importlib.import_module

    def missing(name: str, *args, **kwargs):
        if name.split(".")[0] in ("torchvision", "transformers"):
            raise ImportError(f"No module named '{name}'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(external.importlib, "import_module", missing)
    with pytest.raises(OllieError, match=r"pip install -e '\.\[models\]'"):
        external.build("tv:resnet18")
    with pytest.raises(OllieError, match=r"pip install -e '\.\[models\]'"):
        external.build("hf:bert", layers=1)


@pytest.mark.skipif(not HAS_TV, reason="torchvision not installed (extra 'models')")
def test_torchvision_model_builds_deterministically():
    m1, (x1,) = ollie.zoo.get("tv:squeezenet1_1", batch=2, size=64)
    m2, (x2,) = ollie.zoo.get("tv:squeezenet1_1", batch=2, size=64)
    assert x1.shape == (2, 3, 64, 64) and torch.equal(x1, x2)
    with torch.no_grad():
        y1, y2 = m1(x1), m2(x2)
    assert y1.shape == (2, 1000) and torch.equal(y1, y2) and torch.isfinite(y1).all()
    with pytest.raises(OllieError, match="no model 'nosuchnet'"):
        external.build("tv:nosuchnet")


@pytest.mark.skipif(not HAS_TV, reason="torchvision not installed (extra 'models')")
def test_residual_branches_end_in_marked_batchnorms():
    # as in trained networks, each residual branch's last BatchNorm scales it down; unmarked,
    # a random EfficientNetV2-S at 64x64 came out 1e-3 away from its own float64 output
    tv = external.import_torchvision()
    resnet = tv.models.resnet18(weights=None)
    external.mark_residual_ends(resnet, tv)
    block = resnet.layer2[0]
    assert block.bn2.residual_end and not hasattr(block.bn1, "residual_end")
    assert not hasattr(block.downsample[1], "residual_end")
    m, (x,) = external.build("tv:efficientnet_v2_s", size=64)
    with torch.no_grad():
        y, y64 = m(x).double(), copy.deepcopy(m).double()(x.double())
    assert float((y - y64).abs().max() / y64.abs().max()) < 1e-4


@pytest.mark.skipif(not HAS_HF, reason="transformers not installed (extra 'models')")
def test_transformers_encoder_takes_embeddings():
    m, (x,) = external.build("hf:bert", 2, seq=16, layers=1, hidden=32, heads=4)
    assert x.shape == (2, 16, 32) and x.dtype == torch.float32
    with torch.no_grad():
        y = m(x)
    assert y.shape == (2, 16, 32) and torch.isfinite(y).all()


def test_zero_initialised_layers_get_random_weights():
    """A model whose classifier starts at zero (torchvision's ViT) would give a constant output,
    against which no error can be measured."""
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                 torch.nn.Linear(16, 5))
    torch.nn.init.zeros_(module[2].weight)
    torch.nn.init.zeros_(module[2].bias)
    conv = module[0].weight.clone()
    external.redraw_zero_layers(module)
    assert module[2].weight.abs().min() > 0 and torch.equal(module[0].weight, conv)
    x = torch.randn(2, 3, 4, 4)
    assert not torch.equal(module(x)[0], module(x)[1])
