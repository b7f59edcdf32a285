"""The registry of operator matchers: ``MATCHERS[op](scope, decls)`` and :func:`match_all`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ollie.ir import Scope
from ollie.match.band import match_g2bmm, match_gbmm
from ollie.match.conv import match_conv
from ollie.match.matmul import match_matmul
from ollie.match.result import MatchResult, Mismatch

Matcher = Callable[..., MatchResult | Mismatch]

MATCHERS: dict[str, Matcher] = {
    "Matmul": match_matmul,
    "Conv": match_conv,
    "G2BMM": match_g2bmm,
    "GBMM": match_gbmm,
}


def match_all(scope: Scope, decls: Mapping[str, tuple[int, ...]], name: str | None = None,
              *, layout_eops: bool = True) -> dict[str, MatchResult | Mismatch]:
    """Every registered matcher's answer for ``scope``, by operator name."""
    return {op: fn(scope, decls, name, layout_eops=layout_eops) for op, fn in MATCHERS.items()}
