"""Parser of the expression text syntax (EXPR_SYNTAX.md) into :class:`~ollie.ir.nodes.Expr`.

A hand-written tokenizer and recursive-descent parser. Every error is a
:class:`~ollie.errors.ParseError` whose message starts with ``line:col:`` and says what was
expected or what is wrong (undeclared tensor, unbound iterator, rank mismatch, ...); no other
exception escapes :func:`parse`, whatever the text.

Limits keep every accepted expression within what the later stages handle (they recurse over
the expression tree, compute indices in int64 and give each iterator a numpy axis):
:data:`MAX_DEPTH` bounds how deep an expression nests, :data:`MAX_INT` its integers and
:data:`MAX_RANK` its ranks. Text beyond any is a ParseError at the token that crosses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ollie.errors import ExprError, ParseError
from ollie.ir.index import Affine, Mod, Var, as_affine, var
from ollie.ir.nodes import (
    FUNC_ARITY,
    Access,
    BinOp,
    Call,
    Const,
    Expr,
    Iter,
    Neg,
    Node,
    Scope,
    neg,
)

MAX_DEPTH = 100
"""Deepest expression the parser accepts, in levels. Along any path from the root scope to a
leaf, every binary operator, negation, read and number counts one level; a function call, a
nested scope ``{ ... }[...]`` and an index ``/`` or ``%`` count two (the later stages recurse
more per level there). Parentheses count one level each while the parser reads inside them, so
that ``((((A[i]))))`` is as deep as its parentheses; signs are folded as they are read (``--x``
is ``x``) and cost nothing. The canonical text of an accepted expression is accepted too: it
puts parentheses only around operators, calls and index ``/`` or ``%`` (at most as many as
their levels). Printing, fingerprinting and interpreting an expression of this depth take well
under 600 of Python's default 1000 frames. The texts in the repository's tests and examples
have at most 10 levels; derivation adds about two per step (26 after a default search of
G2BMM)."""

MAX_INT = 1 << 60
"""Largest magnitude of an integer in an expression: integer literals, range bounds, declared
dimension sizes, every value an index expression takes over its iterators' ranges (inside
``/`` and ``%`` too), and the number of elements of a declared tensor or of a scope's output.
It leaves headroom in int64 (2**63) for the offsets and linear positions the interpreter
computes, so index arithmetic never overflows."""

MAX_RANK = 32
"""Most dimensions of a declared tensor and most iterators (traversal and summation) of one
scope. The interpreter gives each iterator of a scope a numpy axis and indexes with up to one
array per dimension; numpy allows 64 dimensions (fewer index arrays), so half of that keeps
every array it builds within numpy's limits. Derivation uses about a dozen iterators at most."""

_LEVEL_CALL = 2  # levels of a function call, a nested scope, an index '/' or '%' (MAX_DEPTH)

_TOKEN = re.compile(
    r"(?P<ws>[ \t\r\n]+)|(?P<comment>#[^\n]*)"
    r"|(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<punct>[:\[\],<>={}()+\-*/%])"
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "num", "name", "punct", "eof"
    text: str
    line: int
    col: int


def tokenize(text: str, source: str | None = None) -> list[Token]:
    """Split text into tokens with 1-based line and column numbers."""
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}", line, pos - line_start + 1,
                             source)
        kind = m.lastgroup
        assert kind is not None, "every alternative of _TOKEN is a named group"
        tok = m.group()
        if kind not in ("ws", "comment"):
            tokens.append(Token(kind, tok, line, pos - line_start + 1))
        for i, ch in enumerate(tok):
            if ch == "\n":
                line += 1
                line_start = pos + i + 1
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


def _describe(tok: Token) -> str:
    return "end of input" if tok.kind == "eof" else repr(tok.text)


class _Parser:
    """Recursive descent over the tokens. The grammar methods of the body and of indices
    return ``(tree, depth)``: the depth in :data:`MAX_DEPTH` levels of the tree they built;
    ``open`` holds the levels of the constructs being read (parentheses, calls, scopes),
    checked before each descent so that the parser's own recursion stays bounded."""

    def __init__(self, text: str, source: str | None) -> None:
        self.source = source
        self.toks = tokenize(text, source)
        self.i = 0
        self.decls: dict[str, tuple[int, ...]] = {}
        self.bound: list[dict[str, Iter]] = []  # iterator scopes, innermost last
        self.open = 0

    # ------------------------------------------------------------- token helpers
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def error(self, message: str, tok: Token | None = None) -> ParseError:
        t = tok or self.tok
        return ParseError(message, t.line, t.col, self.source)

    def at(self, text: str) -> bool:
        return self.tok.kind == "punct" and self.tok.text == text

    def expect(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            raise self.error(f"expected {what or repr(text)}, found {_describe(self.tok)}")
        tok = self.tok
        self.i += 1
        return tok

    def name(self, what: str) -> Token:
        if self.tok.kind != "name":
            raise self.error(f"expected {what}, found {_describe(self.tok)}")
        tok = self.tok
        self.i += 1
        return tok

    def integer(self, what: str, signed: bool = False) -> int:
        sign = 1
        if signed and self.at("-"):
            self.i += 1
            sign = -1
        tok = self.tok
        if tok.kind != "num" or not tok.text.isdigit():
            raise self.error(f"expected {what}, found {_describe(tok)}")
        self.i += 1
        return sign * self.literal(tok)

    def literal(self, tok: Token) -> int:
        """The value of an integer literal, at most :data:`MAX_INT`."""
        digits = tok.text.lstrip("0") or "0"
        if len(digits) > len(str(MAX_INT)) or int(digits) > MAX_INT:
            raise self.error(f"integer {_abbrev(tok.text)} is too large (the largest is "
                             f"2**60 = {MAX_INT})", tok)
        return int(digits)

    # ------------------------------------------------------------- depth limits
    def enter(self, levels: int, tok: Token) -> None:
        """Open a construct of ``levels`` levels at ``tok`` (left again with :meth:`leave`)."""
        self.open += levels
        if self.open > MAX_DEPTH:
            raise self.error(f"nesting deeper than {MAX_DEPTH} levels (parentheses, calls and "
                             "scopes; see ollie.ir.parser.MAX_DEPTH)", tok)

    def leave(self, levels: int) -> None:
        self.open -= levels

    def deep(self, depth: int, tok: Token) -> int:
        """Check the depth of a tree just built at ``tok`` (within the open constructs)."""
        if self.open + depth > MAX_DEPTH:
            raise self.error(f"expression deeper than {MAX_DEPTH} levels (each operator, "
                             "call, scope and index '/' or '%' is a level; see "
                             "ollie.ir.parser.MAX_DEPTH)", tok)
        return depth

    # ------------------------------------------------------------- grammar
    def parse(self) -> Expr:
        while self.tok.kind == "name" and self.peek().kind == "punct" and self.peek().text == ":":
            self.declaration()
        if not (self.tok.kind == "name" and self.tok.text == "L"):
            raise self.error(f"expected a declaration 'NAME: [...]' or a scope 'L<...>', "
                             f"found {_describe(self.tok)}")
        root, _ = self.scope()
        if self.tok.kind != "eof":
            raise self.error(f"expected end of input, found {_describe(self.tok)}")
        return Expr(tuple(self.decls.items()), root)

    def declaration(self) -> None:
        tok = self.name("a tensor name")
        if tok.text in self.decls:
            raise self.error(f"tensor '{tok.text}' declared twice", tok)
        if tok.text in ("L", "Sum") or tok.text in FUNC_ARITY:
            raise self.error(f"'{tok.text}' is reserved and cannot name a tensor", tok)
        self.expect(":")
        self.expect("[")
        dims = [self.dim()]
        while self.at(","):
            self.i += 1
            if len(dims) == MAX_RANK:
                raise self.error(f"tensor '{tok.text}' has more than {MAX_RANK} dimensions", tok)
            dims.append(self.dim())
        self.expect("]", "',' or ']'")
        if math.prod(dims) > MAX_INT:
            raise self.error(f"tensor '{tok.text}' has {math.prod(dims)} elements, more than "
                             f"2**60 = {MAX_INT}", tok)
        self.decls[tok.text] = tuple(dims)

    def dim(self) -> int:
        tok = self.tok
        d = self.integer("a dimension size")
        if d <= 0:
            raise self.error("dimension sizes must be positive", tok)
        return d

    def scope(self) -> tuple[Scope, int]:
        tok = self.name("'L'")
        if tok.text != "L":
            raise self.error(f"expected 'L', found {_describe(tok)}", tok)
        self.expect("<")
        names: dict[str, Iter] = {}
        traversal = self.iter_list(names, allow_empty=True)
        size = math.prod(it.size for it in traversal)
        if size > MAX_INT:
            raise self.error(f"the scope has {size} elements, more than 2**60 = {MAX_INT}", tok)
        summation: tuple[Iter, ...] = ()
        if self.tok.kind == "name" and self.tok.text == "Sum" and self.peek().text == "<":
            self.i += 1
            self.expect("<")
            summation = self.iter_list(names, allow_empty=False)
        self.bound.append(names)
        try:
            body, depth = self.expr()
        finally:
            self.bound.pop()
        return Scope(traversal, summation, body), depth

    def iter_list(self, names: dict[str, Iter], allow_empty: bool) -> tuple[Iter, ...]:
        out: list[Iter] = []
        if allow_empty and self.at(">"):
            self.i += 1
            return ()
        while True:
            tok = self.name("an iterator name")
            if tok.text in names:
                raise self.error(f"iterator '{tok.text}' declared twice in one scope", tok)
            if len(names) == MAX_RANK:
                raise self.error(f"a scope binds at most {MAX_RANK} iterators", tok)
            self.expect("=")
            lo = self.integer("a range start (integer)", signed=True)
            self.expect(":", "':' between range bounds")
            hi = self.integer("a range end (integer)", signed=True)
            if hi <= lo:
                raise self.error(f"empty range {lo}:{hi} for iterator '{tok.text}'", tok)
            it = Iter(tok.text, lo, hi)
            names[tok.text] = it
            out.append(it)
            if self.at(","):
                self.i += 1
                continue
            self.expect(">", "',' or '>'")
            return tuple(out)

    # body: expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)*
    def expr(self) -> tuple[Node, int]:
        node, depth = self.term()
        while self.at("+") or self.at("-"):
            op_tok = self.tok
            self.i += 1
            rhs, rdepth = self.term()
            node = BinOp(op_tok.text, node, rhs)
            depth = self.deep(max(depth, rdepth) + 1, op_tok)
        return node, depth

    def term(self) -> tuple[Node, int]:
        node, depth = self.unary()
        while self.at("*") or self.at("/"):
            op_tok = self.tok
            self.i += 1
            rhs, rdepth = self.unary()
            node = BinOp(op_tok.text, node, rhs)
            depth = self.deep(max(depth, rdepth) + 1, op_tok)
        return node, depth

    def unary(self) -> tuple[Node, int]:
        minus = 0
        while self.at("-"):  # a loop, not recursion: any number of signs folds
            minus += 1
            self.i += 1
        tok = self.tok
        x, depth = self.primary()
        node = neg(x) if minus % 2 else x
        if isinstance(node, Neg) and node.x is x:
            depth = self.deep(depth + 1, tok)
        return node, depth

    def primary(self) -> tuple[Node, int]:
        tok = self.tok
        if tok.kind == "num":
            self.i += 1
            value = float(tok.text)
            if not math.isfinite(value):
                raise self.error(f"number {_abbrev(tok.text)} is too large", tok)
            return Const(value), 1
        if self.at("("):
            self.i += 1
            self.enter(1, tok)
            node, depth = self.expr()
            self.expect(")", "')'")
            self.leave(1)
            return node, depth
        if self.at("{"):
            self.i += 1
            self.enter(_LEVEL_CALL, tok)
            inner_bound, self.bound = self.bound, []
            try:
                sc, depth = self.scope()
            finally:
                self.bound = inner_bound
            self.expect("}", "'}' closing the scope")
            self.leave(_LEVEL_CALL)
            idx, idepth = self.index_list(len(sc.traversal), "the scope")
            return Access(sc, idx), self.deep(max(depth, idepth) + _LEVEL_CALL, tok)
        if tok.kind == "name":
            if self.peek().text == "(" and self.peek().kind == "punct":
                return self.call()
            if self.peek().text == "[" and self.peek().kind == "punct":
                if tok.text not in self.decls:
                    raise self.error(f"tensor '{tok.text}' is not declared", tok)
                self.i += 1
                idx, idepth = self.index_list(len(self.decls[tok.text]), f"tensor '{tok.text}'")
                return Access(tok.text, idx), self.deep(idepth + 1, tok)
            if self.bound and tok.text in self.bound[-1]:
                raise self.error(f"iterator '{tok.text}' used as a value; only tensor reads, "
                                 "numbers and functions are values")
            raise self.error(f"expected '[' after tensor name '{tok.text}'", self.peek())
        raise self.error(f"expected a tensor read, number, function, '(' or '{{', "
                         f"found {_describe(tok)}")

    def call(self) -> tuple[Node, int]:
        tok = self.name("a function name")
        arity = FUNC_ARITY.get(tok.text)
        if arity is None:
            known = ", ".join(sorted(FUNC_ARITY))
            raise self.error(f"unknown function '{tok.text}' (known: {known})", tok)
        self.expect("(")
        self.enter(_LEVEL_CALL, tok)
        arg, depth = self.expr()
        args = [arg]
        while self.at(","):
            self.i += 1
            arg, adepth = self.expr()
            args.append(arg)
            depth = max(depth, adepth)
        self.expect(")", "',' or ')'")
        self.leave(_LEVEL_CALL)
        if len(args) != arity:
            raise self.error(f"{tok.text} takes {arity} argument(s), got {len(args)}", tok)
        return Call(tok.text, tuple(args)), depth + _LEVEL_CALL

    # index: list of index expressions in brackets, checked against the rank
    def index_list(self, rank: int, what: str) -> tuple[tuple[Affine, ...], int]:
        open_tok = self.expect("[", "'['")
        idx: list[Affine] = []
        depth = 0
        while True:
            start = self.tok
            e, edepth = self.index()
            self.check_values(e, start)
            idx.append(e)
            depth = max(depth, edepth)
            if not self.at(","):
                break
            self.i += 1
        self.expect("]", "',' or ']'")
        if len(idx) != rank:
            raise self.error(f"{what} has rank {rank} but is indexed with {len(idx)} "
                             "index expression(s)", open_tok)
        return tuple(idx), depth

    def check_values(self, e: Affine, tok: Token) -> None:
        """Reject an index expression (starting at ``tok``) whose values, or the values of a
        ``/`` or ``%`` argument inside it, can exceed :data:`MAX_INT` in magnitude."""
        ranges = {n: it.range for n, it in self.bound[-1].items()} if self.bound else {}
        if _magnitude(e, ranges) > MAX_INT:
            raise self.error(f"index expression {_abbrev(str(e))} takes values beyond "
                             f"2**60 = {MAX_INT} in magnitude", tok)

    def index(self) -> tuple[Affine, int]:
        node, depth = self.index_term()
        while self.at("+") or self.at("-"):
            op = self.tok.text
            self.i += 1
            rhs, rdepth = self.index_term()
            node = node + rhs if op == "+" else node - rhs
            depth = max(depth, rdepth)
        return node, depth

    def index_term(self) -> tuple[Affine, int]:
        node, depth = self.index_unary()
        while self.at("*") or self.at("/") or self.at("%"):
            op_tok = self.tok
            self.i += 1
            rhs_tok = self.tok
            rhs, rdepth = self.index_unary()
            depth = max(depth, rdepth)
            try:
                if op_tok.text == "*":
                    node = node * rhs
                else:
                    if not rhs.is_const or rhs.const <= 0:
                        raise self.error(f"'{op_tok.text}' needs a positive integer literal on "
                                         "its right", rhs_tok)
                    node = node // rhs.const if op_tok.text == "/" else node % rhs.const
                    depth = self.deep(depth + _LEVEL_CALL, op_tok)
            except ExprError:
                raise self.error("'*' in an index needs an integer literal on one side",
                                 op_tok) from None
        return node, depth

    def index_unary(self) -> tuple[Affine, int]:
        minus = 0
        while self.at("-"):  # a loop, not recursion: any number of signs folds
            minus += 1
            self.i += 1
        node, depth = self.index_primary()
        return (-node if minus % 2 else node), depth

    def index_primary(self) -> tuple[Affine, int]:
        tok = self.tok
        if tok.kind == "num":
            if not tok.text.isdigit():
                raise self.error(f"index literals are integers, found {tok.text!r}")
            self.i += 1
            return as_affine(self.literal(tok)), 0
        if tok.kind == "name":
            scope = self.bound[-1] if self.bound else {}
            if tok.text not in scope:
                names = ", ".join(scope) or "none"
                raise self.error(f"unbound iterator '{tok.text}' (this scope binds: {names})")
            self.i += 1
            return var(tok.text), 0
        if self.at("("):
            self.i += 1
            self.enter(1, tok)
            node, depth = self.index()
            self.expect(")", "')'")
            self.leave(1)
            return node, depth
        raise self.error(f"expected an index expression, found {_describe(tok)}")


def _abbrev(text: str, limit: int = 40) -> str:
    """``text``, shortened to about ``limit`` characters for an error message."""
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-8:]} " \
        f"({len(text)} characters)"


def _magnitude(e: Affine, ranges: Mapping[str, tuple[int, int]]) -> int:
    """An upper bound of ``|value|`` of ``e`` and of every partial sum its evaluation forms;
    more than :data:`MAX_INT` when that holds for a ``/`` or ``%`` argument inside it, or when a
    divisor exceeds :data:`MAX_INT`."""
    total = abs(e.const)
    for atom, c in e.terms:
        if isinstance(atom, Var):
            lo, hi = ranges[atom.name]
            mag = max(abs(lo), abs(hi - 1))
        else:
            if atom.k > MAX_INT or _magnitude(atom.arg, ranges) > MAX_INT:
                return MAX_INT + 1
            mag = atom.k if isinstance(atom, Mod) else max(abs(b) for b in atom.arg.bounds(ranges))
        total += abs(c) * mag
    return total


ExprParser = _Parser
"""The recursive-descent parser, for the program syntax (:mod:`ollie.ir.program_text`)."""


def parse(text: str, source: str | None = None) -> Expr:
    """Parse expression text into an :class:`Expr`; raises :class:`ParseError` on bad text.

    ``source`` (a file name) prefixes error positions when given.
    """
    if not isinstance(text, str):
        raise ParseError(f"expected expression text (str), got {type(text).__name__}", 1, 1,
                         source)
    return _Parser(text, source).parse()
