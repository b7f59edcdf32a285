"""The keys naming distinct subprograms in the model optimiser.

A :class:`SubprogramKey` names one distinct subprogram as measured (its expression's
fingerprint and the inputs measured channels-last) or, with ``alternative``, one alternative
rewrite of a subprogram whose original operator won alone. :attr:`SubprogramKey.text` is its
one textual form: the model optimiser's memo and the program-context step
(:mod:`ollie.optimizer.context`, which caches the keys it switched on) use it as an
identifier; it is built here and never parsed back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ollie.optimizer.select import layout_key


@dataclass(frozen=True, slots=True)
class SubprogramKey:
    """A distinct subprogram (``alternative`` None), or its ``alternative``-th alternative."""

    fingerprint: str
    channels_last: frozenset[str] = field(default_factory=frozenset)
    alternative: int | None = None

    @property
    def text(self) -> str:
        """``<fingerprint>[|cl:<inputs>][|alternative<i>]``."""
        alt = "" if self.alternative is None else f"|alternative{self.alternative}"
        return self.fingerprint + layout_key(self.channels_last) + alt

    @property
    def base(self) -> SubprogramKey:
        """The subprogram an alternative is one of (itself when it is none)."""
        return replace(self, alternative=None)

    def with_alternative(self, i: int) -> SubprogramKey:
        return replace(self, alternative=i)


__all__ = ["SubprogramKey"]
