"""Text syntax of expression programs (:class:`~ollie.ir.exprprogram.ExprProgram`).

An addition to the expression syntax (EXPR_SYNTAX.md; documented in
docs/design/025-program-text.md): input declarations as in one expression, then one
definition ``NAME = <scope>`` per def (reading inputs and earlier defs by name), then
``out NAME, ...`` naming the outputs::

    x: [2, 4]
    Wq: [4, 3]
    Wk: [4, 3]
    Q = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * Wq[k, n]
    K = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * Wk[k, n]
    out Q, K

A def declares exactly the tensors it reads, in program order (inputs, then defs). Every
error is a :class:`~ollie.errors.ParseError` whose message starts with ``line:col:``.
:func:`is_program_text` tells a program from a single expression without parsing either.
"""

from __future__ import annotations

from ollie.errors import ParseError
from ollie.ir.exprprogram import ExprProgram
from ollie.ir.nodes import FUNC_ARITY, Expr, tensor_names
from ollie.ir.parser import ExprParser, tokenize

OUT = "out"
"""The keyword of the outputs line (a keyword only when a name follows it: ``out`` may still
name a tensor, ``out: [4]`` or ``out = L<...> ...``)."""


def is_program_text(text: str) -> bool:
    """Whether ``text`` is written in the program syntax: it has a ``NAME =`` outside any
    iterator list ``<...>`` or an outputs line ``out NAME``. False for text that does not
    tokenize (the expression parser then reports the error)."""
    try:
        toks = tokenize(text)
    except ParseError:
        return False
    angle = 0
    for k, tok in enumerate(toks):
        if tok.kind == "punct" and tok.text in "<>":
            angle += 1 if tok.text == "<" else -1
            continue
        define = tok.kind == "punct" and tok.text == "=" and angle <= 0
        outputs = tok.kind == "name" and tok.text == OUT and toks[k + 1].kind == "name" and \
            (k == 0 or toks[k - 1].kind != "name")
        if define or outputs:
            return True
    return False


def parse_program(text: str, source: str | None = None) -> ExprProgram:
    """Parse program text into a verified :class:`ExprProgram` (see the module doc); raises
    :class:`ParseError` on bad text. ``source`` (a file name) prefixes error positions."""
    if not isinstance(text, str):
        raise ParseError(f"expected program text (str), got {type(text).__name__}", 1, 1,
                         source)
    p = ExprParser(text, source)
    while p.tok.kind == "name" and p.peek().kind == "punct" and p.peek().text == ":":
        p.declaration()
    inputs = tuple(p.decls.items())
    order = {n: i for i, n in enumerate(p.decls)}
    defs: list[tuple[str, Expr]] = []
    while p.tok.kind == "name" and p.peek().kind == "punct" and p.peek().text == "=":
        tok = p.name("a def name")
        if tok.text in p.decls:
            raise p.error(f"tensor '{tok.text}' is already defined", tok)
        if tok.text in ("L", "Sum") or tok.text in FUNC_ARITY:
            raise p.error(f"'{tok.text}' is reserved and cannot name a tensor", tok)
        p.expect("=")
        if not (p.tok.kind == "name" and p.tok.text == "L"):
            raise p.error(f"expected a scope 'L<...>' after '{tok.text} =', found "
                          f"{_describe(p)}")
        root, _ = p.scope()
        reads = sorted(tensor_names(root), key=order.__getitem__)
        expr = Expr(tuple((n, p.decls[n]) for n in reads), root)
        p.decls[tok.text] = expr.shape
        order[tok.text] = len(order)
        defs.append((tok.text, expr))
    if not defs:
        raise p.error("expected a declaration 'NAME: [...]' or a definition 'NAME = L<...>', "
                      f"found {_describe(p)}")
    if not (p.tok.kind == "name" and p.tok.text == OUT and p.peek().kind == "name"):
        raise p.error(f"expected a definition 'NAME = L<...>' or the outputs line "
                      f"'{OUT} NAME, ...', found {_describe(p)}")
    p.i += 1
    defined = {n for n, _ in defs}
    outputs: list[str] = []
    while True:
        tok = p.name("an output name")
        if tok.text not in defined:
            what = "an input" if tok.text in p.decls else "not defined"
            raise p.error(f"output '{tok.text}' is {what}; outputs name defs", tok)
        if tok.text in outputs:
            raise p.error(f"output '{tok.text}' is listed twice", tok)
        outputs.append(tok.text)
        if not p.at(","):
            break
        p.i += 1
    if p.tok.kind != "eof":
        raise p.error(f"expected ',' or end of input, found {_describe(p)}")
    ep = ExprProgram(inputs, tuple(defs), tuple(outputs))
    ep.verify()
    return ep


def _describe(p: ExprParser) -> str:
    return "end of input" if p.tok.kind == "eof" else repr(p.tok.text)


__all__ = ["OUT", "is_program_text", "parse_program"]
