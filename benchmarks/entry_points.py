"""Models nobody on the project wrote, through both entry points with the default settings.

    python benchmarks/entry_points.py MODEL [MODEL ...]

``MODEL``: ``tv:NAME`` (any torchvision classifier, ``ollie.zoo.get``; ``tv:NAME@SIZE`` for
another input size), ``tv:segmentation.NAME`` (a segmentation model, 224x224, its dict of
outputs compared leaf by leaf), ``tv:video.NAME`` (a video classifier, 8 frames of 112x112),
built here as the zoo builds the classifiers (seeded, calibrated, residual ends marked), or
``hfc:NAME``, a small transformers model built here from a config
with random weights (2 layers of hidden 256, 4 heads, sequence 64; NAME one of
:data:`HF_CONFIGS`) taking token embeddings. For each: ``ollie.optimize`` with the default
settings, then ``torch.compile(model, backend="ollie")`` in the same process and cache
directory (so the second shows what the first's cached decisions save), each with the
relative error of its output against the module's on a new random input, its wall time
(model building excluded) and the warnings it emitted. Set ``OLLIE_CACHE_DIR`` to an empty
directory for cold figures. Needs torchvision / transformers (extra 'models').
"""

from __future__ import annotations

import sys
import time
import traceback
import warnings
from collections.abc import Callable

import torch

import ollie
from ollie.zoo.init import seeded

HF_CONFIGS = ("roberta", "distilbert", "gpt2", "albert", "electra", "deberta", "t5enc")


class _Embeddings(torch.nn.Module):
    """A transformers model as a module of float embeddings -> last hidden state."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        return self.model(inputs_embeds=embeds).last_hidden_state


def _hf(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from ollie.zoo.external import import_torchvision

    import_torchvision()  # transformers imports it: where its operators cannot load
    import transformers as tf

    common = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=1024, attn_implementation="eager")
    makers: dict[str, Callable[[], torch.nn.Module]] = {
        "roberta": lambda: tf.RobertaModel(tf.RobertaConfig(**common),
                                           add_pooling_layer=False),
        "distilbert": lambda: tf.DistilBertModel(tf.DistilBertConfig(
            dim=256, n_layers=2, n_heads=4, hidden_dim=1024, attn_implementation="eager")),
        "gpt2": lambda: tf.GPT2Model(tf.GPT2Config(n_embd=256, n_layer=2, n_head=4,
                                                   attn_implementation="eager")),
        "albert": lambda: tf.AlbertModel(tf.AlbertConfig(embedding_size=256, **common),
                                         add_pooling_layer=False),
        "electra": lambda: tf.ElectraModel(tf.ElectraConfig(embedding_size=256, **common)),
        "deberta": lambda: tf.DebertaV2Model(tf.DebertaV2Config(**common)),
        "t5enc": lambda: tf.T5EncoderModel(tf.T5Config(d_model=256, d_ff=1024, num_layers=2,
                                                       num_heads=4, d_kv=64)),
    }
    if name not in makers:
        raise SystemExit(f"hfc:{name}: one of {', '.join(HF_CONFIGS)}")
    with seeded(0):
        module = _Embeddings(makers[name]()).eval()
    return module, (torch.randn(1, 64, 256, generator=torch.Generator().manual_seed(1)),)


def _tv_family(family: str, name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from ollie.zoo.external import import_torchvision, mark_residual_ends, redraw_zero_layers
    from ollie.zoo.init import calibrate

    tv = import_torchvision()
    factory = getattr(getattr(tv.models, family), name)
    shape = (1, 3, 8, 112, 112) if family == "video" else (1, 3, 224, 224)
    with seeded(0), torch.no_grad():
        module = factory(weights=None, **({"weights_backbone": None}
                                          if family == "segmentation" else {})).eval()
        redraw_zero_layers(module)
        mark_residual_ends(module, tv)
        calibrate(module, lambda: (torch.randn(4, *shape[1:]),))
    return module.eval(), (torch.randn(shape, generator=torch.Generator().manual_seed(1)),)


def build(spec: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    kind, _, name = spec.partition(":")
    if kind == "hfc":
        return _hf(name)
    family, dot, member = name.partition(".")
    if kind == "tv" and dot and family in ("segmentation", "video"):
        return _tv_family(family, member)
    name, _, size = spec.partition("@")
    return ollie.zoo.get(name, **({"size": int(size)} if size else {}))


def _rel(y: object, ref: object) -> float:
    """The largest relative error over the tensors of ``y`` against ``ref``'s (the same
    containers: a dict of outputs is compared leaf by leaf)."""
    from torch.utils._pytree import tree_leaves

    if type(y) is not type(ref):
        raise TypeError(f"returned a {type(y).__name__}, the module a {type(ref).__name__}")
    pairs = zip(tree_leaves(y), tree_leaves(ref), strict=True)
    return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in pairs
               if isinstance(b, torch.Tensor))


def _timed(label: str, run: Callable[[], object], ref: object) -> str:
    t = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.no_grad():
                out = run()
            seconds = time.perf_counter() - t
            err = _rel(out, ref)
        except Exception as exc:  # reported, the next entry point still runs
            traceback.print_exc()
            return f"{label} FAILED {type(exc).__name__}: {str(exc)[:300]}"
    return f"{label} rel {err:.1e} in {seconds:.0f} s, {len(caught)} warnings"


def row(spec: str) -> str:
    """One table row: the model, then each entry point's error, seconds and warnings."""
    module, inputs = build(spec)
    x = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = module(x)
    torch._dynamo.reset()
    return " | ".join([spec,
                       _timed("optimize", lambda: ollie.optimize(module, inputs)(x), ref),
                       _timed("compile", lambda: torch.compile(module, backend="ollie")(x),
                              ref)])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for spec in argv:
        print(row(spec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
