"""Memory and work limits of the reference interpreter and of the random inputs it is fed.

Evaluation is chunked (:data:`~ollie.semantics.grid.MAX_ELEMENTS` bounds every intermediate),
but some arrays grow with the expression's sizes: the float64 copy of each input, the values
of each evaluated scope (the result, every materialised nested scope), the random inputs of
:func:`~ollie.semantics.check.random_inputs` and sampled positions. A :class:`Budget` is
charged for each before it is allocated, and the work of each term (the points of its
iteration space) before it is evaluated; going over raises
:class:`~ollie.errors.ResourceError` naming the part of the expression, the size asked for
and the limit, instead of exhausting memory or running for hours.
"""

from __future__ import annotations

from collections.abc import Callable

from ollie.errors import ResourceError

What = str | Callable[[], str]
"""What asks for memory or work, for messages: a string or a function making it (called only
when a limit is crossed, so that checks cost nothing on the way)."""

MAX_BYTES = 4 << 30
"""Default memory limit of one interpretation (``interpret(..., max_bytes=)``), in bytes of
the arrays that grow with the expression's sizes (inputs as float64, scope values), and of the
random inputs made for one expression (``random_inputs(..., max_bytes=)``)."""

MAX_WORK = 1 << 34
"""Default work limit of one interpretation (``interpret(..., max_work=)``): the points of the
iteration spaces evaluated, summed over terms and scopes (about 1.7e10; a batch-16 ResNet-50
3x3 convolution evaluated in full is 1.8e9). An expression asking for more, typically a sum
over a range of billions, is refused rather than evaluated for hours."""


def size_text(nbytes: float) -> str:
    """``nbytes`` in GiB, MiB or bytes, for messages."""
    if nbytes >= 1 << 40:
        return f"{count_text(int(nbytes) >> 30)} GiB"
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.1f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{int(nbytes)} bytes"


def count_text(n: int) -> str:
    """A (possibly huge) count, for messages."""
    return f"{n:.3g}" if n < 1e300 else f"about 10**{len(str(n)) - 1}"


def check_bytes(nbytes: int, limit: int | None, what: str, knob: str) -> None:
    """Raise :class:`ResourceError` when allocating ``nbytes`` for ``what`` exceeds ``limit``
    (None: no limit); ``knob`` names the setting that raises the limit."""
    if limit is not None and nbytes > limit:
        raise ResourceError(f"{what} needs {size_text(nbytes)}, over the limit of "
                            f"{size_text(limit)} ({knob})")


def _text(what: What) -> str:
    return what if isinstance(what, str) else what()


class Budget:
    """What one interpretation may still allocate (bytes) and compute (iteration points)."""

    __slots__ = ("max_bytes", "max_work", "used_bytes", "used_work")

    def __init__(self, max_bytes: int | None = MAX_BYTES, max_work: int | None = MAX_WORK
                 ) -> None:
        self.max_bytes = max_bytes
        self.max_work = max_work
        self.used_bytes = 0
        self.used_work = 0

    def alloc(self, nbytes: int, what: What) -> None:
        """Charge an allocation of ``nbytes`` for ``what`` (raises before it is made)."""
        total = self.used_bytes + nbytes
        if self.max_bytes is not None and total > self.max_bytes:
            held = f" (with {size_text(self.used_bytes)} held already)" if self.used_bytes \
                else ""
            raise ResourceError(
                f"interpreting: {_text(what)} needs {size_text(nbytes)}{held}, over the limit of "
                f"{size_text(self.max_bytes)} (interpret(..., max_bytes=...))")
        self.used_bytes = total

    def work(self, points: int, what: What) -> None:
        """Charge evaluating ``points`` iteration points for ``what``."""
        total = self.used_work + points
        if self.max_work is not None and total > self.max_work:
            done = f" (with {count_text(self.used_work)} done already)" if self.used_work \
                else ""
            raise ResourceError(
                f"interpreting: {_text(what)} needs {count_text(points)} iteration points"
                f"{done}, over the limit of {count_text(self.max_work)} "
                "(interpret(..., max_work=...))")
        self.used_work = total
