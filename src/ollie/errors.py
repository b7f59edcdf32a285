"""Error classes of Ollie: every error raised on purpose derives from `OllieError`."""

from __future__ import annotations


class OllieError(Exception):
    """Base class of every error Ollie raises on purpose."""


class ParseError(OllieError):
    """Malformed expression text; the message starts with ``line:col:``."""

    def __init__(self, message: str, line: int, col: int, source: str | None = None) -> None:
        self.line = line
        self.col = col
        self.source = source
        where = f"{source}:" if source else ""
        super().__init__(f"{where}{line}:{col}: {message}")
        self.message = message


class ExprError(OllieError):
    """A structurally invalid expression (unbound iterator, rank mismatch, empty range, ...)."""


class ShapeError(OllieError):
    """Inputs whose names or shapes do not match what an expression or operator declares."""


class UnsupportedError(OllieError):
    """An operator, attribute combination or construct Ollie does not support."""


class ResourceError(OllieError, MemoryError):
    """A computation that would need more memory (or work) than its documented limit; the
    message names what asked for it, the size asked for and the limit."""


class ConfigError(OllieError, ValueError):
    """A setting outside its range (a negative search budget, a zero tolerance, ...); the
    message names the setting and the value given."""


def check_settings(owner: str, checks: dict[str, tuple[object, bool, str]]) -> None:
    """Raise :class:`ConfigError` for the first setting whose check failed: ``checks`` maps a
    setting's name to (its value, whether it is valid, what a valid one is)."""
    for name, (value, ok, want) in checks.items():
        if not ok:
            raise ConfigError(f"{owner}.{name} must be {want}, got {value!r}")


class InternalError(OllieError):
    """An unexpected failure inside Ollie (a bug): the message names the cause; the original
    exception is chained (``__cause__``)."""
