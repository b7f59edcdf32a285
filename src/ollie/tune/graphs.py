"""Whether programs on a CUDA device replay as captured CUDA graphs
(:mod:`ollie.exec.cuda_graph`): the ``OLLIE_CUDA_GRAPHS`` switch, read when asked. It lives
here, below the executor, because the device description of every measurement
(:func:`ollie.tune.cache.device_key`) depends on it."""

from __future__ import annotations

import os


def enabled() -> bool:
    """Whether CUDA graph capture is on (``OLLIE_CUDA_GRAPHS`` is not 0/false/no/off)."""
    return os.environ.get("OLLIE_CUDA_GRAPHS", "1").strip().lower() not in (
        "0", "false", "no", "off")


__all__ = ["enabled"]
