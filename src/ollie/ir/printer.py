"""Canonical text of expressions (see EXPR_SYNTAX.md); ``parse(format(e)) == e``.

Declarations come one per line, then the expression on one line. Index terms print in the
order their iterators are declared by the enclosing scope (traversal first, then summation),
div/mod atoms after the iterators they use, the constant last.
"""

from __future__ import annotations

from collections.abc import Mapping

from ollie.ir.exprprogram import ExprProgram
from ollie.ir.index import Affine, FloorDiv, Var
from ollie.ir.nodes import Access, BinOp, Call, Const, Expr, Iter, Neg, Node, Scope

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def format_expr(expr: Expr) -> str:
    """The canonical text of an expression: declarations, then the root scope."""
    lines = [f"{name}: [{', '.join(str(d) for d in shape)}]" for name, shape in expr.decls]
    lines.append(format_scope(expr.root))
    return "\n".join(lines) + "\n"


def format_program(ep: ExprProgram) -> str:
    """The canonical text of an expression program (the program syntax of
    :func:`ollie.ir.program_text.parse_program`): one declaration per input, one line
    ``NAME = <root scope>`` per def in order, then ``out NAME, ...``. A def's declarations are
    implied by the tensors it reads, so ``parse_program(format_program(ep)) == ep`` holds when
    each def declares exactly the tensors it reads, in program order (inputs, then defs;
    :meth:`ExprProgram.tidy`)."""
    lines = [f"{name}: [{', '.join(str(d) for d in shape)}]" for name, shape in ep.inputs]
    lines += [f"{name} = {format_scope(expr.root)}" for name, expr in ep.defs]
    lines.append(f"out {', '.join(ep.outputs)}")
    return "\n".join(lines) + "\n"


def format_scope(scope: Scope) -> str:
    """``L<...> Sum<...> body`` of one scope."""
    order = {it.name: i for i, it in enumerate(scope.iters)}
    head = f"L<{_iters(scope.traversal)}>"
    if scope.summation:
        head += f" Sum<{_iters(scope.summation)}>"
    return f"{head} {_body(scope.body, order, 0)}"


def _iters(iters: tuple[Iter, ...]) -> str:
    return ", ".join(f"{it.name}={it.lo}:{it.hi}" for it in iters)


def _fmt_float(v: float) -> str:
    if v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    return repr(float(v))


def _body(node: Node, order: Mapping[str, int], ctx: int) -> str:
    """Print ``node`` where the surrounding context binds with precedence ``ctx``."""
    if isinstance(node, Const):
        return _fmt_float(node.value)
    if isinstance(node, Access):
        idx = ", ".join(format_index(i, order) for i in node.indices)
        if isinstance(node.source, Scope):
            return f"{{ {format_scope(node.source)} }}[{idx}]"
        return f"{node.source}[{idx}]"
    if isinstance(node, Neg):
        return "-" + _body(node.x, order, 3)
    if isinstance(node, Call):
        return f"{node.fn}({', '.join(_body(a, order, 0) for a in node.args)})"
    assert isinstance(node, BinOp)
    p = _PREC[node.op]
    # left-associative: the right operand of - and / (and of any op at equal precedence,
    # to keep the tree shape) needs parentheses when it binds no tighter
    text = f"{_body(node.lhs, order, p)} {node.op} {_body(node.rhs, order, p + 1)}"
    return f"({text})" if p < ctx else text


def _atom_order(atom, order: Mapping[str, int]) -> tuple:
    if isinstance(atom, Var):
        return (order.get(atom.name, len(order)), 0, atom.key())
    names = atom.arg.vars()
    first = min((order.get(n, len(order)) for n in names), default=len(order))
    return (first, 1, atom.key())


def _atom_text(atom, order: Mapping[str, int]) -> tuple[str, bool]:
    """Text of an atom, and whether it is a bare name (needs no parentheses)."""
    if isinstance(atom, Var):
        return atom.name, True
    inner = format_index(atom.arg, order)
    if atom.arg.as_var() is None:
        inner = f"({inner})"
    op = "/" if isinstance(atom, FloorDiv) else "%"
    return f"{inner} {op} {atom.k}", False


def format_index(e: Affine, order: Mapping[str, int] | None = None) -> str:
    """Text of an index expression; ``order`` ranks iterator names for term order."""
    order = order or {}
    parts: list[str] = []
    for atom, c in sorted(e.terms, key=lambda t: _atom_order(t[0], order)):
        text, bare = _atom_text(atom, order)
        mag = abs(c)
        if mag != 1:
            text = f"{mag}*{text}" if bare else f"{mag}*({text})"
        elif not bare and not parts and c < 0:
            text = f"({text})"  # '-x / 2' would parse as (-x) / 2
        if not parts:
            parts.append(f"-{text}" if c < 0 else text)
        else:
            parts.append(f"{'-' if c < 0 else '+'} {text}")
    if e.const or not parts:
        if not parts:
            parts.append(str(e.const))
        else:
            parts.append(f"{'-' if e.const < 0 else '+'} {abs(e.const)}")
    return " ".join(parts)
