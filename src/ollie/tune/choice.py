"""The choice among implementations: one :class:`Choices` object holds, per configuration, the
name of the implementation that measured fastest, and picks by measuring when it has none.

Every chooser asks a :class:`Choices` (convolutions, :func:`ollie.exec.conv.best_conv`; matrix
products, :func:`ollie.exec.linear.best_product`; Winograd tile sizes and product kernels,
:mod:`ollie.kernels.winograd`, :func:`ollie.kernels.blocked_gemm.grouped_products`). Each takes
the object to ask as an argument; without one it asks :func:`shared`, the table of the
settings in effect (:attr:`ollie.settings.Settings.choices`: the process's, so that a
configuration measured while one program is built is not measured again for the next).
Nothing else reads or writes a table: a caller that wants a private, empty choice (a test, a
benchmark) passes its own :class:`Choices` or runs under ``ollie.settings.using(choices={})``.
The shared table is also read from and written to the settings' ``choice_store`` when there is
one (the optimizer's persistent cache, :func:`ollie.tune.cache.choice_store`), so that a
configuration measured by one optimisation is not measured again by the next process.
Measurement: alternately, for a few rounds, with cold caches
(:func:`ollie.tune.measure.evict_caches`) and warm, like a cuDNN benchmark-mode algorithm
choice; an implementation replaces the framework's own only when faster with confidence
(:func:`pick`), and a choice made on a busy machine is remembered only when a second probe
agrees (:meth:`Choices.fastest`).
Why a measured choice: docs/design/003-library-kernels-on-the-cpu.md; why one object:
docs/design/018-package-layout.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

import torch

from ollie.settings import ChoiceStore, current

if TYPE_CHECKING:
    from ollie.tune.measure import Timings

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., torch.Tensor])

ANY_OF = " or "
"""Joins implementation names in a ``prefer`` (:meth:`Choices.fastest_of`): the fastest of
them."""


class Choices:
    """Per configuration key (a hashable value describing what is computed), the name of the
    implementation that measured fastest."""

    def __init__(self, table: dict[Hashable, str] | None = None,
                 store: ChoiceStore | None = None) -> None:
        self.table: dict[Hashable, str] = {} if table is None else table
        """What is remembered (``table``: one to read and write, default a new empty one)."""
        self.store = store
        """Where choices are also recalled from and recorded to (another process's choices),
        by the ``repr`` of their key, for keys made of plain values only (:func:`stored_key`);
        None: ``table`` alone."""

    def get(self, key: Hashable) -> str | None:
        """The name remembered for ``key`` (in the table, else in the store: then copied into
        the table), or None. A stored name is only a hint: every chooser uses it only when it
        names an implementation it offers."""
        name = self.table.get(key)
        text = stored_key(key) if name is None and self.store is not None else None
        if text is not None and self.store is not None:
            name = self.store.recall(text)
            if name is not None:
                self.table[key] = name
        return name

    def remember(self, key: Hashable, name: str) -> None:
        """Remember ``name`` as the choice for ``key`` (recorded in the store too)."""
        self.table[key] = name
        text = stored_key(key) if self.store is not None else None
        if text is not None and self.store is not None:
            self.store.record(text, name)

    def forget(self, key: Hashable) -> None:
        """Drop the choice for ``key`` from the table (if any; one in the store stays)."""
        self.table.pop(key, None)

    def clear(self) -> None:
        """Drop every choice."""
        self.table.clear()

    def __contains__(self, key: object) -> bool:
        return key in self.table

    def __getitem__(self, key: Hashable) -> str:
        return self.table[key]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self.table))

    def __len__(self) -> int:
        return len(self.table)

    def fastest(self, impls: dict[str, F | None], input_shape: tuple[int, ...],
                key: Hashable | None = None,
                make_args: Callable[[], tuple[torch.Tensor, ...]] | None = None,
                baseline: str | None = None) -> F:
        """The fastest of the available ``impls`` (``None``: unavailable) on a random input of
        ``input_shape`` (or on the arguments ``make_args()`` returns, built only when timing
        is needed), timed alternately for a few rounds twice (:func:`probe`): with cold
        caches (:func:`ollie.tune.measure.evict_caches` before each call: in a program, a
        convolution's weight and input are rarely still cached, and an implementation that
        re-lays out the weight on every call looks faster warm than it runs) and warm (each
        sample after a call of its own, as in a program whose weights stay cached).

        ``baseline``: the name of the framework's own implementation (what PyTorch calls):
        another replaces it only when faster with confidence in one of the two probes and not
        slower with confidence in the other (:func:`ollie.tune.decide.faster`; :func:`pick`).
        Made on a busy machine (:func:`ollie.tune.decide.busy`), the choice is probed again
        after a settle; it is remembered per ``key`` only when the second probe agrees (else
        ``baseline``, if any, is returned, and nothing is remembered). While the settings'
        ``new_choices`` says no (an optimisation's total budget is spent), a choice not
        remembered is not measured: ``baseline`` is returned, if usable, and nothing is
        remembered. ValueError when none is available."""
        from ollie.tune.decide import RECHECK_ROUNDS, RECHECK_SETTLE, busy

        usable = {n: f for n, f in impls.items() if f is not None}
        if not usable:
            raise ValueError("no implementation to choose from")
        if len(usable) == 1:
            return next(iter(usable.values()))
        chosen = self.get(key) if key is not None else None
        if chosen in usable:
            return usable[chosen]
        if baseline in usable and not current().new_choices():
            return usable[baseline]
        args = make_args() if make_args is not None else (torch.randn(input_shape),)
        base = baseline if baseline in usable else None
        cold, warm = probe(usable, args)
        name = pick(cold, warm, base)
        log.debug("%s: %s (%s)", list(input_shape), name, ", ".join(
            f"{n} {cold.median(n) * 1e3:.3f} ms cold, {warm.median(n) * 1e3:.3f} ms warm"
            for n in usable))
        if busy(cold.samples[base or name]):
            rival = base if base is not None and base != name else min(
                (n for n in usable if n != name),
                key=lambda n: cold.median(n) + warm.median(n))
            current().sleep(RECHECK_SETTLE)
            pair = {n: usable[n] for n in (name, rival)}
            again = pick(*probe(pair, args, RECHECK_ROUNDS), base)
            if again != name:
                log.info("%s: %s, then %s on a busy machine: not remembered",
                         list(input_shape), name, again)
                return usable[base or again]
        if key is not None:
            self.remember(key, name)
        return usable[name]

    def fastest_of(self, builders: dict[str, Callable[[], F | None]],
                   input_shape: tuple[int, ...], key: tuple,
                   make_args: Callable[[], tuple[torch.Tensor, ...]] | None = None,
                   prefer: str | None = None, baseline: str | None = None) -> F:
        """:meth:`fastest` over implementations built by ``builders`` (each returns a callable
        or None); once a choice is remembered for ``key`` only the chosen one is built
        (building an implementation packs a weight or creates an ONNX Runtime session).
        ``prefer``: the name of the implementation to use, without measuring, when it can be
        built (a program-level choice, :mod:`ollie.optimizer.libraries`); names joined by
        :data:`ANY_OF`: the fastest of those that can be built, measured. ``baseline``: see
        :meth:`fastest` (while the settings' ``new_choices`` says no, a choice not remembered
        builds only the baseline)."""
        if prefer is not None and ANY_OF in prefer:  # the fastest of these, measured
            subset = {n: builders[n] for n in prefer.split(ANY_OF) if n in builders}
            if subset:
                builders, key, prefer = subset, (*key, prefer), None
        if prefer in builders:
            impl = builders[prefer]()
            if impl is not None:
                return impl
        chosen = self.get(key)
        if chosen in builders:
            impl = builders[chosen]()
            if impl is not None:
                return impl
        if baseline in builders and not current().new_choices():  # no choice measured now:
            impl = builders[baseline]()  # the baseline alone built (nothing compiled)
            if impl is not None:
                return impl
        return self.fastest({name: build() for name, build in builders.items()}, input_shape,
                            key, make_args, baseline)


PROBE_ROUNDS = 7
"""Interleaved rounds of each probe of :meth:`Choices.fastest` (cold, then warm)."""

PROBE_SECONDS = 3.0
"""Later rounds of a probe stop after this long."""


def probe(impls: Mapping[str, Callable[..., object]], args: tuple[torch.Tensor, ...],
          rounds: int = PROBE_ROUNDS) -> tuple[Timings, Timings]:
    """Every sample of each of ``impls`` called on ``args``, timed in interleaved rounds
    (:func:`ollie.tune.measure.measure_rounds`) with cold caches (each call after
    :func:`~ollie.tune.measure.evict_caches`), then warm (each sample after a call of its
    own)."""
    from ollie.tune.measure import evict_caches, measure_rounds

    fns: dict[str, Callable[[], object]] = {n: functools.partial(f, *args)
                                            for n, f in impls.items()}
    cold = measure_rounds(fns, rounds=rounds, warmup=1, max_seconds=PROBE_SECONDS,
                          prepare=evict_caches)
    warm = measure_rounds(fns, rounds=rounds, warmup=1, max_seconds=PROBE_SECONDS,
                          lead_calls=1)
    return cold, warm


def pick(cold: Timings, warm: Timings, baseline: str | None = None) -> str:
    """The name chosen from two probes (:func:`probe`): of the implementations eligible, the
    one whose cold and warm medians add up least. With a ``baseline``, another is eligible
    only when it is faster than the baseline with confidence in one probe and the baseline is
    not faster than it with confidence in the other (:func:`ollie.tune.decide.faster`); none
    is: the baseline. Without one, every implementation is eligible."""
    from ollie.tune.decide import faster

    def total(n: str) -> float:
        return cold.median(n) + warm.median(n)

    if baseline is None:
        return min(cold.samples, key=total)
    eligible = [n for n in cold.samples if n != baseline and any(
        faster(t.samples[n], t.samples[baseline]).decided for t in (cold, warm)) and not any(
        faster(t.samples[baseline], t.samples[n]).decided for t in (cold, warm))]
    return min(eligible, key=total, default=baseline)


def shared() -> Choices:
    """The choices of the settings in effect (:attr:`ollie.settings.Settings.choices`, backed
    by their ``choice_store``), asked by every chooser given no :class:`Choices` of its
    own."""
    settings = current()
    return Choices(settings.choices, settings.choice_store)


def stored_key(key: Hashable) -> str | None:
    """``repr(key)`` when ``key`` is built of plain values only (strings, numbers, booleans,
    None and tuples of them: the same text in every process), else None (not stored)."""
    def plain(v: object) -> bool:
        if isinstance(v, tuple):
            return all(plain(x) for x in v)
        return v is None or isinstance(v, (str, int, float, bool))
    return repr(key) if plain(key) else None


__all__ = ["ANY_OF", "PROBE_ROUNDS", "PROBE_SECONDS", "Choices", "pick", "probe", "shared",
           "stored_key"]
