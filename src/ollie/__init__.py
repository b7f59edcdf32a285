"""Ollie: a derivation-based tensor program optimizer.

Public entry points (see API.md): :func:`parse`, :func:`format`, :func:`interpret`.
"""

from ollie.errors import (
    ConfigError,
    ExprError,
    OllieError,
    ParseError,
    ShapeError,
    UnsupportedError,
)
from ollie.fingerprint import FingerprintSet, canonical_form, fingerprint
from ollie.ir import Expr, parse
from ollie.ir import format_expr as format
from ollie.optimizer.model import OptimizeConfig, load, optimize
from ollie.search import derive
from ollie.semantics import interpret

__all__ = [
    "ConfigError",
    "Expr",
    "ExprError",
    "FingerprintSet",
    "OllieError",
    "OptimizeConfig",
    "ParseError",
    "ShapeError",
    "UnsupportedError",
    "canonical_form",
    "derive",
    "fingerprint",
    "format",
    "interpret",
    "load",
    "optimize",
    "parse",
]
__version__ = "0.1.0"


def _register_torch_compile_backend() -> None:
    from ollie.optimizer.backend import register

    register()


_register_torch_compile_backend()
