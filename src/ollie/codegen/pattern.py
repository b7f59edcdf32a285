"""Generated numba functions with their sizes as arguments: one text per expression *pattern*.

The loop nests :mod:`ollie.codegen.emit` and :mod:`ollie.codegen.scatter` write hold the
shape of the expression as integer literals. Two expressions equal up to some of them (a
layer at another channel count, the model at another batch) give functions of the same text
once those are taken out. :func:`parametrise` does that to one generated function: each
integer literal it takes out becomes a local ``_szK`` loaded on entry from a new last
parameter ``sz`` (a C-contiguous ``int64`` array, added to the explicit signature), and the
values are returned, in the order of ``K``, for the caller to pass
(:func:`parametrise_module`). The function computes exactly what the literal form computes:
every replaced literal is read back as the same ``int64`` value numba types a literal as, and
a division rewritten as a multiplication (below) is exact in the range it is used in. Its
text no longer depends on the values taken out, so the content-addressed nest cache
(:mod:`ollie.codegen.nests`) compiles it once for all of them.

Taken out: the sizes of the *outer* loops, those at the function's top level (the fused
``prange`` of the leading traversal iterators, the loop of a flat pass, and the nested serial
loops over ``_p0, _p1, ...`` of a serial nest, :meth:`ollie.codegen.emit.NestEmitter.function`):

- their bounds;
- the integers of the statements directly in the innermost one's body that compute from
  their indices without a call (the decomposition of a fused index into iterators: divisors
  and offsets). A floor division or modulo of a fused index (or of a quotient of it) by a
  divisor ``d`` becomes an exact multiplication by a magic number and a shift (``p // d ==
  (p * m) >> s``, :func:`magic`), the index being below the loop's count, at most
  :data:`MAX_ITEMS` (a hardware division by a number read from memory is slow);
- the coefficients of those iterators anywhere in the function (their strides).

Everything else stays literal: the extents and interior intervals of the innermost traversal
loops, the windows of summations, the bounds of checked reads, inner divisors and strides.
LLVM's code for them depends on the values (short loops of known trip count unrolled and
vectorised whole, bounds checks folded against known offsets, divisions by constants), and taking
them out slows the kernels down. Kernels that differ in them have different texts and do not
share. Measurements: docs/design/028-pattern-kernels.md.
"""

from __future__ import annotations

import ast

SIZES_PARAM = "sz"
"""The parameter holding the sizes taken out of a function (last, ``int64[::1]``)."""

MAX_ITEMS = 2**31
"""An outer loop of at most this many items has its index divisions done by :func:`magic`
(the products then fit in 63 bits); a longer one keeps divisions by argument."""


def magic(d: int) -> tuple[int, int]:
    """``(m, s)`` with ``p // d == (p * m) >> s`` for every ``0 <= p < 2**31`` and ``p * m <
    2**63`` (``d >= 1``): ``s = 31 + ceil(log2 d)``, ``m = ceil(2**s / d)``; then ``m * d -
    2**s < d <= 2**(s - 31)``, the condition for exactness (Granlund and Montgomery,
    "Division by invariant integers using multiplication", PLDI 1994)."""
    if d < 1:
        raise ValueError(f"divisor {d} < 1")
    s = 31 + (d - 1).bit_length()
    return -(-(1 << s) // d), s


def _int_literal(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_literal(node.operand)
        return None if inner is None else -inner
    return None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _constants(node: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) is int
            and n.value != 0]


def _outer(top: ast.stmt) -> list[ast.For]:
    """The outer loops starting at the top-level statement ``top``: ``top`` when it is a
    ``prange`` loop or a loop over ``_p...``, and each loop over ``_p...`` that is the whole
    body of the one before (the nested form of fused loops,
    :meth:`ollie.codegen.emit.NestEmitter.function`)."""
    chain: list[ast.For] = []
    node: ast.stmt | None = top
    while isinstance(node, ast.For) and isinstance(node.target, ast.Name) and \
            (node.target.id.startswith("_p") or (
                not chain and isinstance(node.iter, ast.Call)
                and isinstance(node.iter.func, ast.Name) and node.iter.func.id == "prange")):
        chain.append(node)
        node = node.body[0] if len(node.body) == 1 and not node.orelse else None
    return chain


class _Plan:
    """What :func:`parametrise` takes out of one function: ``tokens``, (line, column) of the
    literals read from ``sz``; ``divisions``, the floor divisions and modulos rewritten with
    :func:`magic`."""

    def __init__(self, fn: ast.FunctionDef) -> None:
        self.tokens: set[tuple[int, int]] = set()
        self.divisions: list[ast.BinOp] = []
        derived: set[str] = set()
        for top in fn.body:
            chain = _outer(top)
            if not chain:
                continue
            targets = [loop.target.id for loop in chain if isinstance(loop.target, ast.Name)]
            for loop in chain:
                self.tokens |= {(c.lineno, c.col_offset) for c in _constants(loop.iter)}
            derived.update(targets)
            it = chain[0].iter
            count = _int_literal(it.args[0]) if isinstance(it, ast.Call) \
                and len(it.args) == 1 and len(chain) == 1 else None
            quotients = set(targets) if count is not None and count <= MAX_ITEMS else set()
            for stmt in chain[-1].body:  # the decomposition: computes from the indices
                if not (isinstance(stmt, ast.Assign) and _names(stmt.value) & derived) or \
                        any(isinstance(n, ast.Call) for n in ast.walk(stmt.value)):
                    continue
                names = {t.id for t in stmt.targets if isinstance(t, ast.Name)}
                derived |= names
                exact = [b for b in ast.walk(stmt.value) if isinstance(b, ast.BinOp)
                         and isinstance(b.op, ast.FloorDiv | ast.Mod)
                         and isinstance(b.left, ast.Name) and b.left.id in quotients
                         and (_int_literal(b.right) or 0) >= 1
                         and b.lineno == b.end_lineno]
                self.divisions += exact
                skip = {id(c) for b in exact for c in _constants(b)}
                self.tokens |= {(c.lineno, c.col_offset) for c in _constants(stmt.value)
                                if id(c) not in skip}
                if isinstance(stmt.value, ast.BinOp) and stmt.value in exact and \
                        isinstance(stmt.value.op, ast.FloorDiv):
                    quotients |= names
        for node in ast.walk(fn):  # strides of the outer iterators
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                for a, b in ((node.left, node.right), (node.right, node.left)):
                    if isinstance(b, ast.Name) and b.id in derived and \
                            isinstance(a, ast.Constant) and type(a.value) is int and a.value:
                        self.tokens.add((a.lineno, a.col_offset))


def parametrise(text: str) -> tuple[str, tuple[int, ...]]:
    """``text``, one generated ``@njit("void(...)")`` function (its decorator at column 0),
    with its sizes taken out (see the module doc), and their values in parameter order. A
    function with none to take out is returned unchanged with ``()``."""
    tree = ast.parse(text)
    (fn,) = tree.body
    assert isinstance(fn, ast.FunctionDef) and len(fn.decorator_list) == 1, text
    deco = fn.decorator_list[0]
    assert isinstance(deco, ast.Call) and isinstance(deco.args[0], ast.Constant), text
    signature = deco.args[0].value
    assert isinstance(signature, str) and signature.endswith(")"), text
    plan = _Plan(fn)
    # (line, start column, end column, replacement with {} for the values, values)
    edits: list[tuple[int, int, int, str, tuple[int, ...]]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Constant) and (node.lineno, node.col_offset) in plan.tokens:
            assert type(node.value) is int and node.end_col_offset is not None
            edits.append((node.lineno, node.col_offset, node.end_col_offset, "{}",
                          (node.value,)))
    for div in plan.divisions:
        assert isinstance(div.left, ast.Name) and div.end_col_offset is not None
        d = _int_literal(div.right)
        assert d is not None
        m, s = magic(d)
        q = f"(({div.left.id} * {{}}) >> {{}})"
        if isinstance(div.op, ast.FloorDiv):
            edits.append((div.lineno, div.col_offset, div.end_col_offset, q, (m, s)))
        else:
            edits.append((div.lineno, div.col_offset, div.end_col_offset,
                          f"({div.left.id} - {q} * {{}})", (m, s, d)))
    if not edits:
        return text, ()
    edits.sort()
    values: list[int] = []
    lines = text.splitlines()
    texts = []
    for *_, template, vals in edits:
        names = [f"_{SIZES_PARAM}{len(values) + k}" for k in range(len(vals))]
        texts.append(template.format(*names))
        values += vals
    for (row, col, end, *_), new in reversed(list(zip(edits, texts, strict=True))):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[end:]
    new_sig = signature[:-1] + ", int64[::1])"
    deco_line = deco.args[0].lineno - 1
    lines[deco_line] = lines[deco_line].replace(f'"{signature}"', f'"{new_sig}"', 1)
    def_line = fn.lineno - 1
    head = lines[def_line]
    cut = head.rindex("):")
    params = [a.arg for a in fn.args.args]
    lines[def_line] = head[:cut] + (", " if params else "") + SIZES_PARAM + head[cut:]
    first = fn.body[0]
    after = first.end_lineno if _is_doc(first) and len(fn.body) > 1 else fn.lineno
    assert after is not None
    loads = [f"    _{SIZES_PARAM}{k} = {SIZES_PARAM}[{k}]" for k in range(len(values))]
    lines[after:after] = loads
    return "\n".join(lines), tuple(values)


def _is_doc(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
        and isinstance(stmt.value.value, str)


def parametrise_module(text: str) -> str:
    """A generated kernel module with every ``@njit`` function passed through
    :func:`parametrise`: the values of function ``f`` become the module constant ``SIZES_f``
    (an ``int64`` array), passed as the last argument wherever an undecorated function
    (``run``) calls ``f``. The module text around them is kept."""
    lines = text.splitlines()
    functions = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
    sized: dict[str, tuple[int, ...]] = {}
    for node in reversed(functions):  # bottom-up: line numbers above stay valid
        if node.decorator_list:
            start, end = node.decorator_list[0].lineno - 1, node.end_lineno or node.lineno
            new, values = parametrise("\n".join(lines[start:end]))
            if values:
                sized[node.name] = values
                lines[start:end] = new.splitlines()
    if not sized:
        return text
    tree = ast.parse("\n".join(lines))
    calls = [c for fn in tree.body if isinstance(fn, ast.FunctionDef) and not fn.decorator_list
             for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
             and c.func.id in sized]
    for call in sorted(calls, key=lambda c: (c.end_lineno or 0, c.end_col_offset or 0),
                       reverse=True):
        assert isinstance(call.func, ast.Name) and call.end_lineno is not None \
            and call.end_col_offset is not None
        row, col = call.end_lineno - 1, call.end_col_offset - 1  # the closing parenthesis
        extra = (", " if call.args else "") + f"SIZES_{call.func.id}"
        lines[row] = lines[row][:col] + extra + lines[row][col:]
    first = min(n.decorator_list[0].lineno for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.decorator_list) - 1
    lines[first:first] = [*(f"SIZES_{name} = np.array({list(values)!r}, dtype=np.int64)"
                            for name, values in reversed(sized.items())), "", ""]
    return "\n".join(lines) + "\n"


__all__ = ["MAX_ITEMS", "SIZES_PARAM", "magic", "parametrise", "parametrise_module"]
