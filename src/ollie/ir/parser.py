"""Parser of the expression text syntax (EXPR_SYNTAX.md) into :class:`~ollie.ir.nodes.Expr`.

A hand-written tokenizer and recursive-descent parser. Every error is a
:class:`~ollie.errors.ParseError` whose message starts with ``line:col:`` and says what was
expected or what is wrong (undeclared tensor, unbound iterator, rank mismatch, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ollie.errors import ExprError, ParseError
from ollie.ir.index import Affine, as_affine, var
from ollie.ir.nodes import (
    FUNC_ARITY,
    Access,
    BinOp,
    Call,
    Const,
    Expr,
    Iter,
    Node,
    Scope,
    neg,
)

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
    def __init__(self, text: str, source: str | None) -> None:
        self.source = source
        self.toks = tokenize(text, source)
        self.i = 0
        self.decls: dict[str, tuple[int, ...]] = {}
        self.bound: list[dict[str, Iter]] = []  # iterator scopes, innermost last

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
        return sign * int(tok.text)

    # ------------------------------------------------------------- grammar
    def parse(self) -> Expr:
        while self.tok.kind == "name" and self.peek().kind == "punct" and self.peek().text == ":":
            self.declaration()
        if not (self.tok.kind == "name" and self.tok.text == "L"):
            raise self.error(f"expected a declaration 'NAME: [...]' or a scope 'L<...>', "
                             f"found {_describe(self.tok)}")
        root = self.scope()
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
            dims.append(self.dim())
        self.expect("]", "',' or ']'")
        self.decls[tok.text] = tuple(dims)

    def dim(self) -> int:
        tok = self.tok
        d = self.integer("a dimension size")
        if d <= 0:
            raise self.error("dimension sizes must be positive", tok)
        return d

    def scope(self) -> Scope:
        tok = self.name("'L'")
        if tok.text != "L":
            raise self.error(f"expected 'L', found {_describe(tok)}", tok)
        self.expect("<")
        names: dict[str, Iter] = {}
        traversal = self.iter_list(names, allow_empty=True)
        summation: tuple[Iter, ...] = ()
        if self.tok.kind == "name" and self.tok.text == "Sum" and self.peek().text == "<":
            self.i += 1
            self.expect("<")
            summation = self.iter_list(names, allow_empty=False)
        self.bound.append(names)
        try:
            body = self.expr()
        finally:
            self.bound.pop()
        return Scope(traversal, summation, body)

    def iter_list(self, names: dict[str, Iter], allow_empty: bool) -> tuple[Iter, ...]:
        out: list[Iter] = []
        if allow_empty and self.at(">"):
            self.i += 1
            return ()
        while True:
            tok = self.name("an iterator name")
            if tok.text in names:
                raise self.error(f"iterator '{tok.text}' declared twice in one scope", tok)
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
    def expr(self) -> Node:
        node = self.term()
        while self.at("+") or self.at("-"):
            op = self.tok.text
            self.i += 1
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.at("*") or self.at("/"):
            op = self.tok.text
            self.i += 1
            node = BinOp(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.at("-"):
            self.i += 1
            return neg(self.unary())
        return self.primary()

    def primary(self) -> Node:
        tok = self.tok
        if tok.kind == "num":
            self.i += 1
            return Const(float(tok.text))
        if self.at("("):
            self.i += 1
            node = self.expr()
            self.expect(")", "')'")
            return node
        if self.at("{"):
            self.i += 1
            inner_bound, self.bound = self.bound, []
            try:
                sc = self.scope()
            finally:
                self.bound = inner_bound
            self.expect("}", "'}' closing the scope")
            idx = self.index_list(len(sc.traversal), "the scope")
            return Access(sc, idx)
        if tok.kind == "name":
            if self.peek().text == "(" and self.peek().kind == "punct":
                return self.call()
            if self.peek().text == "[" and self.peek().kind == "punct":
                if tok.text not in self.decls:
                    raise self.error(f"tensor '{tok.text}' is not declared", tok)
                self.i += 1
                idx = self.index_list(len(self.decls[tok.text]), f"tensor '{tok.text}'")
                return Access(tok.text, idx)
            if self.bound and tok.text in self.bound[-1]:
                raise self.error(f"iterator '{tok.text}' used as a value; only tensor reads, "
                                 "numbers and functions are values")
            raise self.error(f"expected '[' after tensor name '{tok.text}'", self.peek())
        raise self.error(f"expected a tensor read, number, function, '(' or '{{', "
                         f"found {_describe(tok)}")

    def call(self) -> Node:
        tok = self.name("a function name")
        arity = FUNC_ARITY.get(tok.text)
        if arity is None:
            known = ", ".join(sorted(FUNC_ARITY))
            raise self.error(f"unknown function '{tok.text}' (known: {known})", tok)
        self.expect("(")
        args = [self.expr()]
        while self.at(","):
            self.i += 1
            args.append(self.expr())
        self.expect(")", "',' or ')'")
        if len(args) != arity:
            raise self.error(f"{tok.text} takes {arity} argument(s), got {len(args)}", tok)
        return Call(tok.text, tuple(args))

    # index: list of index expressions in brackets, checked against the rank
    def index_list(self, rank: int, what: str) -> tuple[Affine, ...]:
        open_tok = self.expect("[", "'['")
        idx = [self.index()]
        while self.at(","):
            self.i += 1
            idx.append(self.index())
        self.expect("]", "',' or ']'")
        if len(idx) != rank:
            raise self.error(f"{what} has rank {rank} but is indexed with {len(idx)} "
                             "index expression(s)", open_tok)
        return tuple(idx)

    def index(self) -> Affine:
        node = self.index_term()
        while self.at("+") or self.at("-"):
            op = self.tok.text
            self.i += 1
            rhs = self.index_term()
            node = node + rhs if op == "+" else node - rhs
        return node

    def index_term(self) -> Affine:
        node = self.index_unary()
        while self.at("*") or self.at("/") or self.at("%"):
            op_tok = self.tok
            self.i += 1
            rhs_tok = self.tok
            rhs = self.index_unary()
            try:
                if op_tok.text == "*":
                    node = node * rhs
                else:
                    if not rhs.is_const or rhs.const <= 0:
                        raise self.error(f"'{op_tok.text}' needs a positive integer literal on "
                                         "its right", rhs_tok)
                    node = node // rhs.const if op_tok.text == "/" else node % rhs.const
            except ExprError:
                raise self.error("'*' in an index needs an integer literal on one side",
                                 op_tok) from None
        return node

    def index_unary(self) -> Affine:
        if self.at("-"):
            self.i += 1
            return -self.index_unary()
        tok = self.tok
        if tok.kind == "num":
            if not tok.text.isdigit():
                raise self.error(f"index literals are integers, found {tok.text!r}")
            self.i += 1
            return as_affine(int(tok.text))
        if tok.kind == "name":
            scope = self.bound[-1] if self.bound else {}
            if tok.text not in scope:
                names = ", ".join(scope) or "none"
                raise self.error(f"unbound iterator '{tok.text}' (this scope binds: {names})")
            self.i += 1
            return var(tok.text)
        if self.at("("):
            self.i += 1
            node = self.index()
            self.expect(")", "')'")
            return node
        raise self.error(f"expected an index expression, found {_describe(tok)}")


def parse(text: str, source: str | None = None) -> Expr:
    """Parse expression text into an :class:`Expr`; raises :class:`ParseError` on bad text.

    ``source`` (a file name) prefixes error positions when given.
    """
    if not isinstance(text, str):
        raise ParseError(f"expected expression text (str), got {type(text).__name__}", 1, 1,
                         source)
    return _Parser(text, source).parse()
