"""Ollie: a derivation-based tensor program optimizer.

Public entry points (see API.md): :func:`parse`, :func:`format`, :func:`interpret`.
"""

from ollie.errors import ExprError, OllieError, ParseError, ShapeError, UnsupportedError
from ollie.ir import Expr, parse
from ollie.ir import format_expr as format
from ollie.semantics import interpret

__all__ = [
    "Expr", "ExprError", "OllieError", "ParseError", "ShapeError", "UnsupportedError",
    "format", "interpret", "parse",
]
__version__ = "0.1.0"
