"""Expression programs: several expressions of one subprogram, each defining a named tensor.

An :class:`ExprProgram` declares its ``inputs`` (name, shape), a topologically ordered tuple of
``defs`` (tensor name, expression), each reading only inputs and earlier defs, and names its
``outputs`` among the defs. It is the container the inter-expression rules
(:mod:`ollie.rules.inter`) act on: a subprogram with several outputs (siblings merged into one
expression and sliced back) has one def per tensor. Its meaning is
:func:`ollie.semantics.program.interpret_program`, its fingerprint
:func:`ollie.fingerprint.program_fingerprint` (the IR does not import the fingerprint module,
which imports the IR). The program rules are :mod:`ollie.rules.inter_program`; the text form
is :func:`ollie.ir.program_text.parse_program` and :func:`ollie.ir.printer.format_program`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ollie.errors import ExprError
from ollie.ir.nodes import Expr, rename_expr, tensor_names
from ollie.ir.verify import verify

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ExprProgram:
    """Inputs, definitions in topological order, and the names of the outputs."""

    inputs: tuple[tuple[str, Shape], ...]
    defs: tuple[tuple[str, Expr], ...]
    outputs: tuple[str, ...]

    def shapes(self) -> dict[str, Shape]:
        """The shape of every tensor: the inputs' and each def's."""
        out = {n: tuple(s) for n, s in self.inputs}
        out.update((n, tuple(e.shape)) for n, e in self.defs)
        return out

    def verify(self) -> None:
        """Raise :class:`~ollie.errors.ExprError` unless every name is defined once, each def
        is a well-formed expression (:func:`ollie.ir.verify`) that declares only inputs and
        earlier defs with their shapes, and every output is a def."""
        known: dict[str, Shape] = {}
        for name, shape in self.inputs:
            if name in known:
                raise ExprError(f"expression program: input '{name}' declared twice")
            known[name] = tuple(shape)
        for name, expr in self.defs:
            if name in known:
                raise ExprError(f"expression program: '{name}' is defined twice")
            verify(expr)
            for dep, shape in expr.decls:
                if dep not in known:
                    raise ExprError(f"expression program: '{name}' reads '{dep}', which is "
                                    "neither an input nor an earlier def")
                if known[dep] != tuple(shape):
                    raise ExprError(f"expression program: '{name}' declares '{dep}' as "
                                    f"{list(shape)}, but it is {list(known[dep])}")
            known[name] = tuple(expr.shape)
        defined = {n for n, _ in self.defs}
        missing = [o for o in self.outputs if o not in defined]
        if missing or not self.outputs:
            raise ExprError(f"expression program: outputs {missing or '(none)'} are not defs")

    def canonical(self) -> tuple[ExprProgram, dict[str, str]]:
        """The program with its inputs renamed ``x0, x1, ...`` and its defs ``y0, y1, ...`` in
        order, and the renaming (original name -> canonical name)."""
        names = {n: f"x{i}" for i, (n, _) in enumerate(self.inputs)}
        names.update({n: f"y{i}" for i, (n, _) in enumerate(self.defs)})
        return ExprProgram(tuple((names[n], s) for n, s in self.inputs),
                           tuple((names[n], rename_expr(e, names)) for n, e in self.defs),
                           tuple(names[o] for o in self.outputs)), names

    def renamed(self, names: Mapping[str, str]) -> ExprProgram:
        """The program with the tensors in ``names`` renamed (others kept)."""
        return ExprProgram(tuple((names.get(n, n), s) for n, s in self.inputs),
                           tuple((names.get(n, n), rename_expr(e, names)) for n, e in self.defs),
                           tuple(names.get(o, o) for o in self.outputs))

    def readers(self) -> dict[str, list[str]]:
        """For every tensor (input or def), the defs that read it, in program order."""
        out: dict[str, list[str]] = {n: [] for n in self.shapes()}
        for name, expr in self.defs:
            for dep in sorted(tensor_names(expr.root)):
                out.setdefault(dep, []).append(name)
        return out

    def tidy(self) -> ExprProgram:
        """The program with each def declaring exactly the tensors it reads, in program order
        (inputs as declared, then defs): the form the program text syntax implies
        (:func:`ollie.ir.printer.format_program`). Raises
        :class:`~ollie.errors.ExprError` when a def reads a tensor the program lacks."""
        shapes = self.shapes()
        order = {n: i for i, n in enumerate(shapes)}
        defs = []
        for name, expr in self.defs:
            reads = tensor_names(expr.root)
            missing = reads - shapes.keys()
            if missing:
                raise ExprError(f"expression program: '{name}' reads {sorted(missing)}, "
                                "which the program does not define")
            decls = tuple((n, shapes[n]) for n in sorted(reads, key=order.__getitem__))
            defs.append((name, Expr(decls, expr.root)))
        return ExprProgram(self.inputs, tuple(defs), self.outputs)


__all__ = ["ExprProgram"]
