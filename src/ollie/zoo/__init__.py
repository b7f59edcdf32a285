"""The seven evaluation models of MODELS.md as PyTorch modules with fixed random weights.

    module, (x,) = ollie.zoo.get("resnet18", batch=1)
    ollie.zoo.MODELS["longformer"].build(1, seq=256, width=16)

Names: infogan, dcgan, srcnn, gcn, resnet18, csrnet, longformer. Importing this package also
registers the ``torch.ops.ollie.g2bmm`` / ``gbmm`` custom operators (:mod:`ollie.zoo.ops`).
"""

from ollie.zoo.ops import g2bmm, gbmm
from ollie.zoo.registry import MODELS, ModelSpec, get

NAMES: tuple[str, ...] = tuple(MODELS)

__all__ = ["MODELS", "NAMES", "ModelSpec", "g2bmm", "gbmm", "get"]
