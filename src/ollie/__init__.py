"""Ollie: a derivation-based tensor program optimizer.

Public entry points (API.md): :func:`parse`, :func:`format`, :func:`interpret`,
:func:`fingerprint`, :func:`derive`, :func:`optimize`, :func:`load`, and the
``torch.compile(model, backend="ollie")`` backend.

:mod:`ollie.settings` (``ollie.settings.using(...)``) holds the process-wide settings: the cache
directory, switches and clocks, read from the environment once.

``import ollie`` is light: the expression language, fingerprints, the errors and the settings
load at once; the search, the optimizer (and with it PyTorch) load on first use of the names
that need them (``fingerprint`` is bound after its module is imported, so the submodule never
shadows the function). The torch.compile backend is registered through the
``torch_dynamo_backends`` entry point of the installed package: torch finds ``"ollie"`` when
a model is compiled with it, whether or not ``ollie`` was imported, and importing ``ollie``
has no side effect on torch (:func:`ollie.optimizer.backend.register` registers it by hand,
e.g. for a source tree that is not installed).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ollie import settings
from ollie.errors import (
    ConfigError,
    ExprError,
    OllieError,
    ParseError,
    ResourceError,
    ShapeError,
    UnsupportedError,
)
from ollie.fingerprint import FingerprintSet, canonical_form, fingerprint
from ollie.ir import Expr, parse
from ollie.ir import format_expr as format

if TYPE_CHECKING:
    from ollie.optimizer.model import OptimizeConfig, load, optimize
    from ollie.search import derive
    from ollie.semantics import interpret

_LAZY = {
    "OptimizeConfig": "ollie.optimizer.model",
    "load": "ollie.optimizer.model",
    "optimize": "ollie.optimizer.model",
    "derive": "ollie.search",
    "interpret": "ollie.semantics",
}
"""Public names loaded on first use, by the module that defines them."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ollie' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ConfigError",
    "Expr",
    "ExprError",
    "FingerprintSet",
    "OllieError",
    "OptimizeConfig",
    "ParseError",
    "ResourceError",
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
    "settings",
]
__version__ = "0.1.0"
