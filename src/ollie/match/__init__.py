"""Operator matching: the iterator mapping table, one matcher per library operator (Matmul,
Conv, G2BMM, GBMM), the registry, and eOperator generation.

    res = match_matmul(scope, decls)       # MatchResult (truthy) or Mismatch (falsy)
    res.kernels, res.output, res.params    # layout eOps + library kernel (+ output eOp)
    match_all(scope, decls)                # {"Matmul": ..., "Conv": ..., ...}
    make_eop(scope, decls, name)           # an eOp Kernel computing the scope
"""

from ollie.match.band import match_g2bmm, match_gbmm
from ollie.match.conv import match_conv
from ollie.match.eop import COMPUTE_BOUND_INTENSITY, make_eop
from ollie.match.matmul import match_matmul
from ollie.match.registry import MATCHERS, match_all
from ollie.match.result import Issue, MatchResult, Mismatch
from ollie.match.table import IterTable, build_table

__all__ = [
    "COMPUTE_BOUND_INTENSITY", "MATCHERS", "Issue", "IterTable", "MatchResult", "Mismatch",
    "build_table", "make_eop", "match_all", "match_conv", "match_g2bmm", "match_gbmm",
    "match_matmul",
]
