"""Whether programs on a CUDA device replay as captured CUDA graphs
(:mod:`ollie.exec.cuda_graph`): the settings' ``cuda_graphs`` (:mod:`ollie.settings`;
``OLLIE_CUDA_GRAPHS=0`` in the environment turns it off). It lives here, below the executor,
because the device description of every measurement (:func:`ollie.tune.cache.device_key`)
depends on it."""

from __future__ import annotations

from ollie.settings import current


def enabled() -> bool:
    """Whether CUDA graph capture is on (the current settings' ``cuda_graphs``)."""
    return current().cuda_graphs


__all__ = ["enabled"]
