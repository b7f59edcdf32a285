"""The table of evaluation models, ``MODELS``, and :func:`get`.

``MODELS[name].build(batch, **options) -> (module, example_inputs)`` builds the model with
fixed random weights (seed 0, calibrated so activations stay O(1), see :mod:`ollie.zoo.init`)
in ``eval()`` mode, and a fixed random example input batch (seed 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ollie.errors import OllieError
from ollie.zoo.bert import BertLayer
from ollie.zoo.gcn import GCN
from ollie.zoo.generators import SRCNN, CSRNetBackend, DCGANGenerator, InfoGANGenerator
from ollie.zoo.init import calibrate, seeded
from ollie.zoo.longformer import LongformerLayer
from ollie.zoo.resnet import ResNet18

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]
WEIGHT_SEED = 0
INPUT_SEED = 1
_CALIBRATION_BATCH = 2


@dataclass(frozen=True)
class ModelSpec:
    """One evaluation model: ``build(batch, **options)`` returns ``(module, example_inputs)``;
    ``input_shape(batch, **options)`` / ``output_shape(batch, **options)`` the shapes of its
    single input and output; ``options`` the accepted keyword options and their defaults."""

    name: str
    build: Callable[..., Built]
    description: str
    input_shape: Callable[..., tuple[int, ...]]
    output_shape: Callable[..., tuple[int, ...]]
    options: dict[str, int] = field(default_factory=dict)


def _make(factory: Callable[[], nn.Module], shape: Callable[[int], tuple[int, ...]],
          calib_shape: tuple[int, ...] | None) -> Callable[..., Built]:
    calib = calib_shape or shape(_CALIBRATION_BATCH)

    def build(batch: int = 1) -> Built:
        with seeded(WEIGHT_SEED):
            module = factory()
            calibrate(module, lambda: (torch.randn(calib),))
        with seeded(INPUT_SEED):
            x = torch.randn(shape(batch))
        return module.eval(), (x,)

    return build


def _spec(name: str, factory: Callable[[], nn.Module], in_shape: Callable[[int], tuple],
          out_shape: Callable[[int], tuple], description: str,
          calib_shape: tuple[int, ...] | None = None) -> ModelSpec:
    """``calib_shape``: a smaller calibration input for the fully convolutional image models
    (their weights do not depend on the resolution)."""
    return ModelSpec(name, _make(factory, in_shape, calib_shape), description, in_shape,
                     out_shape)


_LF_DEFAULTS = {"seq": 10000, "width": 1000, "dilation": 4}
_LF_HIDDEN = 512


def _build_longformer(batch: int = 1, seq: int = 10000, width: int = 1000,
                      dilation: int = 4, ops: str = "custom") -> Built:
    with seeded(WEIGHT_SEED):
        module = LongformerLayer(width, dilation, ops=ops)
        # the weights do not depend on seq: calibrate on a short sequence
        calib = min(seq, 256)
        calibrate(module, lambda: (torch.randn(_CALIBRATION_BATCH, calib, _LF_HIDDEN),))
    with seeded(INPUT_SEED):
        x = torch.randn(batch, seq, _LF_HIDDEN)
    return module.eval(), (x,)


def _lf_shape(batch: int, seq: int = 10000, width: int = 1000,
              dilation: int = 4) -> tuple[int, ...]:
    return (batch, seq, _LF_HIDDEN)


_LF_PLAIN_DEFAULTS = {"seq": 1024, "width": 64, "dilation": 4}
"""Smaller than the evaluation Longformer: eager PyTorch materialises the band window
``[b*8, seq, 64, 2w+1]`` of the plain variant (270 MB at these sizes)."""


def _build_longformer_plain(batch: int = 1, seq: int = 1024, width: int = 64,
                            dilation: int = 4) -> Built:
    return _build_longformer(batch, seq, width, dilation, ops="torch")


_BERT_DEFAULTS = {"seq": 128, "hidden": 768, "heads": 12, "ffn": 3072}


def _build_bert(batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12,
                ffn: int = 3072) -> Built:
    with seeded(WEIGHT_SEED):
        module = BertLayer(hidden, heads, ffn)
        calibrate(module, lambda: (torch.randn(_CALIBRATION_BATCH, min(seq, 128), hidden),))
    with seeded(INPUT_SEED):
        x = torch.randn(batch, seq, hidden)
    return module.eval(), (x,)


def _bert_shape(batch: int, seq: int = 128, hidden: int = 768, heads: int = 12,
                ffn: int = 3072) -> tuple[int, ...]:
    return (batch, seq, hidden)


PAPER_NAMES = ("infogan", "dcgan", "srcnn", "gcn", "resnet18", "csrnet", "longformer")
"""The seven evaluation models of MODELS.md (``MODELS`` also holds the transformer extras)."""

MODELS: dict[str, ModelSpec] = {
    s.name: s for s in [
        _spec("infogan", InfoGANGenerator, lambda b: (b, 228, 1, 1), lambda b: (b, 3, 32, 32),
              "InfoGAN generator: 5 ConvTranspose2d (228->448->256->128->64->3), ReLU, Tanh"),
        _spec("dcgan", DCGANGenerator, lambda b: (b, 100, 1, 1), lambda b: (b, 3, 64, 64),
              "DCGAN generator: 5 ConvTranspose2d (100->512->256->128->64->3), ReLU, Tanh"),
        _spec("srcnn", SRCNN, lambda b: (b, 1, 224, 224), lambda b: (b, 1, 224, 224),
              "SRCNN: Conv 9x9 1->64, 5x5 64->32, 5x5 32->1, ReLU between",
              calib_shape=(_CALIBRATION_BATCH, 1, 64, 64)),
        _spec("gcn", GCN, lambda b: (b, 3, 224, 224), lambda b: (b, 21, 224, 224),
              "GCN segmentation: ResNet-50 backbone, k=7 global conv blocks, boundary "
              "refinement, deconvolution upsampling, 21 classes",
              calib_shape=(_CALIBRATION_BATCH, 3, 96, 96)),
        _spec("resnet18", ResNet18, lambda b: (b, 3, 224, 224), lambda b: (b, 1000),
              "ResNet-18 (torchvision architecture, BatchNorm in the module)",
              calib_shape=(_CALIBRATION_BATCH, 3, 96, 96)),
        _spec("csrnet", CSRNetBackend, lambda b: (b, 512, 14, 14), lambda b: (b, 64, 14, 14),
              "CSRNet back end: six 3x3 dilation-2 convolutions 512->...->64, ReLU"),
        ModelSpec("longformer", _build_longformer,
                  "Longformer attention layer: Q/K/V Linear, G2BMM/GBMM (w=1000, d=4), "
                  "softmax, two Linear+ReLU, residual; seq 10000, hidden 512, 8 heads",
                  _lf_shape, _lf_shape, dict(_LF_DEFAULTS)),
        ModelSpec("bert", _build_bert,
                  "BERT encoder layer: Q/K/V Linear, matmul, softmax, matmul, out Linear, "
                  "residual + LayerNorm, GELU FFN; seq 128, hidden 768, 12 heads, FFN 3072",
                  _bert_shape, _bert_shape, dict(_BERT_DEFAULTS)),
        ModelSpec("longformer_plain", _build_longformer_plain,
                  "Longformer layer with the banded products in plain PyTorch (pad, dilated "
                  "unfold, product, sum); seq 1024, w=64, d=4, hidden 512, 8 heads",
                  _lf_shape, _lf_shape, dict(_LF_PLAIN_DEFAULTS)),
    ]
}


def get(name: str, batch: int = 1, **options: int) -> Built:
    """Build zoo model ``name`` (``zoo:`` prefix allowed) for batch size ``batch``; returns
    ``(module, example_inputs)``. ``options`` are model options (Longformer and
    longformer_plain: ``seq``, ``width``, ``dilation``; BERT: ``seq``, ``hidden``, ``heads``,
    ``ffn``). ``tv:NAME`` / ``hf:NAME`` build torchvision / transformers models
    (:mod:`ollie.zoo.external`, optional dependencies)."""
    if name.startswith(("tv:", "hf:")):
        from ollie.zoo.external import build
        return build(name, batch, **options)
    key = name.removeprefix("zoo:").lower()
    spec = MODELS.get(key)
    if spec is None:
        raise OllieError(f"unknown zoo model '{name}' (known: {', '.join(MODELS)})")
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        allowed = ", ".join(spec.options) or "none"
        raise OllieError(f"zoo model '{key}': unknown option(s) {', '.join(unknown)} "
                         f"(allowed: {allowed})")
    if not isinstance(batch, int) or batch < 1:
        raise OllieError(f"zoo model '{key}': batch must be a positive int, got {batch!r}")
    return spec.build(batch, **options)
