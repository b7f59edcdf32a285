"""The seven evaluation models of MODELS.md, and two transformer layers, as PyTorch modules
with fixed random weights.

    module, (x,) = ollie.zoo.get("resnet18", batch=1)
    ollie.zoo.MODELS["longformer"].build(1, seq=256, width=16)

Names: infogan, dcgan, srcnn, gcn, resnet18, csrnet, longformer (``NAMES``, the paper's seven),
and the transformer extras bert and longformer_plain (in ``MODELS``, not in ``NAMES``).
Importing this package also registers the ``torch.ops.ollie.g2bmm`` / ``gbmm`` custom
operators (:mod:`ollie.zoo.ops`).
"""

from ollie.zoo.ops import g2bmm, gbmm
from ollie.zoo.registry import MODELS, PAPER_NAMES, ModelSpec, get

NAMES: tuple[str, ...] = PAPER_NAMES

__all__ = ["MODELS", "NAMES", "ModelSpec", "g2bmm", "gbmm", "get"]
