"""Random shapes of the operator cases (:data:`ollie.bench.cases.CASES`): one family per case,
its sizes drawn from small ranges, its target the case's. Used by the random-shape tests
(hypothesis draws from :attr:`Family.ranges`) and by ``ollie bench search --random-shapes``
(:func:`draw`), so that what the search must find is checked on shapes nobody tuned it for.

Ranges are inclusive and small (channels up to 16, spatial sizes up to 12, sequences up to
96, bands up to 8 each side, dilations 2 to 4): the search verifies each candidate through
the reference interpreter, which runs in float64 on the whole output. The 9x9 convolution
draws images of 9 to 16 (a smaller image reads mostly padding: the derivation to 3x3
convolutions then has nothing to tile) and at most 4 input channels, as SRCNN's first layer;
the dilated one images larger than the dilation (else its outer taps read only padding and
it is no dilated convolution).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ollie.bench.cases import CASES, conv_text, g2bmm_text, gbmm_text, tconv_text


@dataclass(frozen=True)
class Family:
    """``case``: the :data:`~ollie.bench.cases.CASES` entry whose target applies;
    ``ranges``: each size's inclusive bounds; ``text``: the expression text of one draw."""

    case: str
    ranges: Mapping[str, tuple[int, int]]
    text: Callable[[Mapping[str, int]], str]

    @property
    def target(self) -> Callable:
        return CASES[self.case].target


def _matmul_strided(p: Mapping[str, int]) -> str:
    b, m, n, k = p["b"], p["m"], p["n"], p["k"]
    return (f"C: [{b + 1}, 2, {m}, {k + 1}]\nD: [{b + 2}, {b + 1}, {k}, {n}]\n"
            f"L<b=1:{b + 1}, m=0:{m}, n=0:{n}> Sum<k=0:{k}> "
            "C[b, 0, m, 1 + k] * D[b - 1, b, k, n]\n")


def _matmul_t(p: Mapping[str, int]) -> str:
    m, n, k = p["m"], p["n"], p["k"]
    return (f"A: [{k}, {m}]\nB: [{n}, {k}]\n"
            f"L<m=0:{m}, n=0:{n}> Sum<k=0:{k}> A[k, m] * B[n, k]\n")


CONV = {"n": (1, 2), "c": (1, 16), "h": (3, 12), "w": (3, 12), "f": (1, 16)}
BAND = {"b": (1, 2), "m": (16, 96), "w": (1, 8), "d": (2, 4)}

FAMILIES: dict[str, Family] = {
    "conv3x3": Family("conv3x3", CONV, lambda p: conv_text(
        p["n"], p["c"], p["h"], p["w"], p["f"], 3, 3, 1)),
    "conv1x7": Family("conv1x7", {**CONV, "w": (7, 12)}, lambda p: conv_text(
        p["n"], p["c"], p["h"], p["w"], p["f"], 1, 7, 0, 3)),
    "convtranspose": Family("convtranspose", {"n": (1, 2), "ci": (1, 16), "h": (1, 4),
                                              "co": (1, 16)},
                            lambda p: tconv_text(p["n"], p["ci"], p["h"], p["co"])),
    "conv5x5": Family("conv5x5", CONV, lambda p: conv_text(
        p["n"], p["c"], p["h"], p["w"], p["f"], 5, 5, 2)),
    "conv9x9": Family("conv9x9", {**CONV, "c": (1, 4), "h": (9, 16), "w": (9, 16), "f": (1, 8)},
                      lambda p: conv_text(
        p["n"], p["c"], p["h"], p["w"], p["f"], 9, 9, 4)),
    "dilated_conv": Family("dilated_conv", {**CONV, "h": (4, 12), "w": (4, 12), "d": (2, 3)},
                           lambda p: conv_text(
        p["n"], p["c"], p["h"], p["w"], p["f"], 3, 3, p["d"], d=p["d"])),
    "g2bmm": Family("g2bmm", {**BAND, "k": (1, 16)}, lambda p: g2bmm_text(
        p["b"], p["m"], p["k"], p["w"], p["d"])),
    "gbmm": Family("gbmm", {**BAND, "n": (1, 16)}, lambda p: gbmm_text(
        p["b"], p["m"], p["n"], p["w"], p["d"])),
    "matmul_transposed": Family("matmul_transposed", {"m": (1, 64), "n": (1, 64),
                                                      "k": (1, 64)}, _matmul_t),
    "matmul_strided": Family("matmul_strided", {"b": (1, 4), "m": (1, 32), "n": (1, 32),
                                                "k": (1, 32)}, _matmul_strided),
}


def draw(family: Family, rng: np.random.Generator) -> dict[str, int]:
    """One set of sizes of ``family``, each uniform in its range."""
    return {name: int(rng.integers(lo, hi + 1)) for name, (lo, hi) in family.ranges.items()}


__all__ = ["FAMILIES", "Family", "draw"]
