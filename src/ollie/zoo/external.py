"""Models nobody on the project wrote: torchvision classifiers (``tv:NAME``) and
transformers encoders (``hf:NAME``), with random weights, as benchmark and test inputs.

Both libraries are optional (``pip install -e '.[models]'``); asking for such a model without
them raises an :class:`~ollie.errors.OllieError` saying what to install. Nothing is
downloaded: weights are drawn under a fixed seed and calibrated like the zoo's own models
(:mod:`ollie.zoo.init`), inputs are a fixed random batch.

* ``tv:NAME``: ``torchvision.models.NAME(weights=None)`` in eval mode, input
  ``[batch, 3, size, size]`` (option ``size``, default 224); a layer torchvision initialises
  to zero (ViT's classifier head) gets a random weight, so that the output is not constant.
  torchvision's compiled operators (``nms``, ``roi_align``, ...) are built against one torch
  build; where they cannot load (torchvision's PyPI wheel on a CPU-only torch),
  :func:`import_torchvision` declares the two operators torchvision's import registers
  unconditionally, so that the package (whose classification models use none of them)
  imports; calling one of those operators then raises torch's "no kernel" error. transformers
  imports an installed torchvision, so ``hf:NAME`` goes through :func:`import_torchvision`
  first.
* ``hf:NAME``: a transformers encoder built from a config (``bert``: BERT-base, 12 layers of
  hidden 768, 12 heads; ``longformer``: Longformer-base-sized with sliding-window attention,
  window 128) taking token embeddings ``[batch, seq, hidden]`` (``inputs_embeds``: Ollie
  optimises float32 programs, so the integer token lookup stays outside) and returning the
  last hidden state. Options ``seq`` (default 128; Longformer pads to a multiple of its window
  internally), ``layers``, ``hidden``, ``heads`` (and ``window`` for Longformer).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from ollie.errors import OllieError
from ollie.zoo.init import calibrate, seeded

log = logging.getLogger(__name__)
Built = tuple[nn.Module, tuple[torch.Tensor, ...]]

TORCHVISION_MODELS: tuple[str, ...] = (
    "resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0",
    "convnext_tiny", "regnet_y_400mf", "shufflenet_v2_x1_0", "squeezenet1_1", "densenet121",
    "vit_b_16")
"""The torchvision models of the benchmark suite (any other ``torchvision.models`` builder
name is accepted too)."""

HF_MODELS: dict[str, dict[str, int]] = {
    "bert": {"seq": 128, "layers": 12, "hidden": 768, "heads": 12},
    "longformer": {"seq": 512, "layers": 12, "hidden": 768, "heads": 12, "window": 128},
}
"""The transformers encoders and their options with defaults."""

CALIBRATION_BATCH = 8
"""Images in the batch a ``tv:`` model's layers are calibrated on (:func:`calibrate`)."""

_INSTALL = "install the optional model suites: pip install -e '.[models]'"
_SHIM_OPS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
             "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_shim: list[torch.library.Library] = []


def import_torchvision() -> ModuleType:
    """``import torchvision``, also where its compiled operators cannot load (see the module
    docstring); an :class:`OllieError` when it is not installed."""
    try:
        return importlib.import_module("torchvision")
    except ImportError as exc:
        raise OllieError(f"torchvision is not installed ({exc}); {_INSTALL}") from exc
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    if not _shim:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _SHIM_OPS:
            lib.define(schema)
        _shim.append(lib)
    log.warning("torchvision's compiled operators do not load with this torch build; its "
                "classification models do not use them")
    return importlib.import_module("torchvision")


def _seeded_input(shape: tuple[int, ...]) -> torch.Tensor:
    with seeded(1):
        return torch.randn(shape)


def redraw_zero_layers(module: nn.Module) -> None:
    """Give each convolution or linear layer whose weight is all zero (ViT's classifier head
    is initialised so) the default random weight of its class, so that the model's output
    depends on its input."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)) and not bool(m.weight.any()):
            m.reset_parameters()


def mark_residual_ends(module: nn.Module, tv: ModuleType) -> None:
    """Mark the BatchNorm that ends each residual branch of a torchvision model
    (``residual_end``, read by :func:`ollie.zoo.init.calibrate`), as the zoo's ResNets do:
    the last BatchNorm of a block that adds its input back (``use_res_connect`` /
    ``apply_residual`` set: MobileNet, EfficientNet, MNASNet blocks; torchvision's ResNet and
    RegNet residual blocks), outside its shortcut. Unmarked, every residual add of a random
    network doubles its activations' variance: a random EfficientNetV2-S's float32 output
    then differs from its own float64 output by 12%, too ill-conditioned for any rewrite to
    be checked against it."""
    blocks = (tv.models.resnet.BasicBlock, tv.models.resnet.Bottleneck,
              tv.models.regnet.ResBottleneckBlock)
    for m in module.modules():
        if isinstance(m, blocks) or getattr(m, "use_res_connect", False) is True or \
                getattr(m, "apply_residual", False) is True:
            norms = [b for name, b in m.named_modules()
                     if isinstance(b, nn.BatchNorm2d)
                     and name.split(".")[0] not in ("downsample", "proj")]
            if norms:
                norms[-1].residual_end = True


def build_torchvision(name: str, batch: int = 1, size: int = 224) -> Built:
    """``tv:NAME`` (see the module docstring)."""
    tv = import_torchvision()
    factory: Callable[..., nn.Module] | None = getattr(tv.models, name, None)
    if factory is None or not callable(factory) or name.startswith("_"):
        raise OllieError(f"tv:{name}: torchvision.models has no model '{name}' (suite: "
                         f"{', '.join(TORCHVISION_MODELS)})")
    # a ViT needs its own resolution; convolutional models calibrate on a smaller one
    calib = size if name.startswith(("vit", "swin")) else min(size, 96)
    with seeded(0), torch.no_grad():
        module = factory(weights=None)
        module.eval()
        redraw_zero_layers(module)
        mark_residual_ends(module, tv)
        # 8 images: the BatchNorms of the last, smallest feature maps need that many values
        # for running statistics that hold on other inputs (with 2, a random EfficientNet's
        # activations grow by orders of magnitude on new inputs, and so does float32 rounding)
        calibrate(module, lambda: (torch.randn(CALIBRATION_BATCH, 3, calib, calib),))
    return module.eval(), (_seeded_input((batch, 3, size, size)),)


class _Encoder(nn.Module):
    """A transformers encoder as a module of float embeddings -> last hidden state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_embeds=embeds).last_hidden_state


def build_transformers(name: str, batch: int = 1, **options: int) -> Built:
    """``hf:NAME`` (see the module docstring)."""
    if name not in HF_MODELS:
        raise OllieError(f"hf:{name}: unknown model (known: {', '.join(HF_MODELS)})")
    unknown = sorted(set(options) - set(HF_MODELS[name]))
    if unknown:
        raise OllieError(f"hf:{name}: unknown option(s) {', '.join(unknown)} "
                         f"(allowed: {', '.join(HF_MODELS[name])})")
    o = {**HF_MODELS[name], **options}
    # transformers imports an installed torchvision: let it import where its ops cannot load
    with contextlib.suppress(OllieError):  # not installed: transformers does without it
        import_torchvision()
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as exc:
        raise OllieError(f"transformers is not installed ({exc}); {_INSTALL}") from exc
    common = {"hidden_size": o["hidden"], "num_hidden_layers": o["layers"],
              "num_attention_heads": o["heads"], "intermediate_size": 4 * o["hidden"],
              "attn_implementation": "eager"}
    with seeded(0):
        if name == "bert":
            config = transformers.BertConfig(**common)
            model = transformers.BertModel(config, add_pooling_layer=False)
        else:
            config = transformers.LongformerConfig(attention_window=o["window"], **common)
            model = transformers.LongformerModel(config, add_pooling_layer=False)
    module = _Encoder(model).eval()
    return module, (_seeded_input((batch, o["seq"], o["hidden"])),)


def build(spec: str, batch: int = 1, **options: int) -> Built:
    """Build ``tv:NAME`` or ``hf:NAME`` for batch size ``batch`` with model ``options``."""
    kind, _, name = spec.partition(":")
    if kind == "tv":
        unknown = sorted(set(options) - {"size"})
        if unknown:
            raise OllieError(f"{spec}: unknown option(s) {', '.join(unknown)} (allowed: size)")
        return build_torchvision(name, batch, **options)
    if kind == "hf":
        return build_transformers(name, batch, **options)
    raise OllieError(f"'{spec}': not a tv:NAME or hf:NAME model")
