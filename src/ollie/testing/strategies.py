"""Hypothesis strategies for random well-formed index expressions and expressions.

Used by the property tests of the IR, the interpreter, the rules and the fingerprint. The
generated expressions are small (so a brute-force evaluator stays fast), exercise zero padding
(indices that leave the tensor), negative range starts, div/mod indices and nested scopes, and
avoid functions that overflow or produce NaN on random data. :func:`padded_products` draws
products of reads that leave their tensors (where structural zeros annihilate),
:func:`inputs_with_specials` inputs for an expression with NaN and infinities at random
positions, and :func:`expr_programs` small expression programs for the inter-expression rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st

from ollie.ir import (
    Access,
    Affine,
    BinOp,
    Call,
    Const,
    Expr,
    Iter,
    Node,
    Scope,
    accesses,
    const,
    neg,
    rename_expr,
    tensor_names,
    var,
)
from ollie.ir.exprprogram import ExprProgram

if TYPE_CHECKING:
    from ollie.graph import Graph

ITER_NAMES = ("i", "j", "k", "l", "m", "p", "q", "u")


@st.composite
def index_exprs(draw, names: tuple[str, ...], max_div: int = 3, allow_divmod: bool = True
                ) -> Affine:
    """A random affine index over ``names`` with small coefficients and maybe a div/mod."""
    e = const(draw(st.integers(-2, 2)))
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)):
        e = e + var(name) * draw(st.sampled_from([1, 1, 1, 2, -1]))
    if allow_divmod and draw(st.integers(0, 4)) == 0:
        k = draw(st.integers(2, max_div))
        e = e // k if draw(st.booleans()) else e % k
    return e


@st.composite
def iters(draw, n_min: int, n_max: int, taken: set[str]) -> tuple[Iter, ...]:
    n = draw(st.integers(n_min, n_max))
    out = []
    for _ in range(n):
        name = draw(st.sampled_from([x for x in ITER_NAMES if x not in taken]))
        taken.add(name)
        lo = draw(st.integers(-2, 1))
        out.append(Iter(name, lo, lo + draw(st.integers(1, 4))))
    return tuple(out)


@st.composite
def scopes(draw, decls: dict[str, tuple[int, ...]], depth: int = 1, max_sum: int = 2) -> Scope:
    """A random closed scope reading the tensors of ``decls`` (and maybe a nested scope)."""
    taken: set[str] = set()
    trav = draw(iters(1, 3, taken))
    summ = draw(iters(0, max_sum, taken))
    names = tuple(it.name for it in trav + summ)

    def read() -> st.SearchStrategy[Node]:
        @st.composite
        def _read(d):
            if depth > 0 and d(st.integers(0, 5)) == 0:
                inner = d(scopes(decls, depth - 1, max_sum=1))
                idx = tuple(d(index_exprs(names)) for _ in inner.traversal)
                return Access(inner, idx)
            t = d(st.sampled_from(sorted(decls)))
            return Access(t, tuple(d(index_exprs(names)) for _ in decls[t]))
        return _read()

    leaves = st.one_of(read(), read(), st.sampled_from([0.5, 2.0, 3.0]).map(Const))
    body = draw(st.recursive(
        leaves,
        lambda sub: st.one_of(
            st.tuples(st.sampled_from("+-*"), sub, sub).map(lambda t: BinOp(*t)),
            sub.map(neg),
            st.tuples(st.sampled_from(["relu", "abs", "tanh", "sigmoid"]), sub)
            .map(lambda t: Call(t[0], (t[1],))),
            st.tuples(st.sampled_from(["max", "min"]), sub, sub)
            .map(lambda t: Call(t[0], (t[1], t[2]))),
        ),
        max_leaves=4,
    ))
    return Scope(trav, summ, body)


@st.composite
def exprs(draw, depth: int = 1, max_sum: int = 2) -> Expr:
    """A random well-formed :class:`Expr` with 1-2 declared tensors of rank 1-3."""
    decls: dict[str, tuple[int, ...]] = {}
    for name in ("A", "B")[: draw(st.integers(1, 2))]:
        decls[name] = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    root = draw(scopes(decls, depth, max_sum))
    return Expr(tuple(decls.items()), root)


@st.composite
def padded_products(draw) -> Expr:
    """Products of two or three reads of one or two tensors (sizes 2-6) at affine indices
    that leave the tensors over iterator ranges wider than them, maybe inside a sum, a
    negation, a quotient by a read or a function, and maybe through a nested scope: where a
    read is outside its tensor its product is a structural zero."""
    decls = {name: tuple(draw(st.lists(st.integers(2, 6), min_size=1, max_size=2)))
             for name in ("A", "B")[: draw(st.integers(1, 2))]}
    taken: set[str] = set()
    trav = tuple(Iter(it.name, it.lo, it.lo + draw(st.integers(2, 7)))
                 for it in draw(iters(1, 2, taken)))
    summ = draw(iters(0, 2, taken))
    names = tuple(it.name for it in trav + summ)

    def read() -> Node:
        t = draw(st.sampled_from(sorted(decls)))
        acc = Access(t, tuple(draw(index_exprs(names, allow_divmod=draw(st.booleans())))
                              for _ in decls[t]))
        if draw(st.integers(0, 5)) == 0:  # through a re-indexing nested scope
            inner = Scope(tuple(Iter(f"d{k}", -1, n + 1) for k, n in enumerate(decls[t])),
                          (), Access(t, tuple(var(f"d{k}") for k in range(len(decls[t])))))
            acc = Access(inner, acc.indices)
        return acc

    body: Node = BinOp("*", read(), read())
    kind = draw(st.integers(0, 6))
    if kind == 1:
        body = BinOp("*", body, read())
    elif kind == 2:
        body = BinOp("*", BinOp(draw(st.sampled_from("+-")), read(), read()), read())
    elif kind == 3:
        body = neg(BinOp("/", read(), read()))
    elif kind == 4:
        body = BinOp("+", body, Call(draw(st.sampled_from(["relu", "exp", "abs"])), (read(),)))
    elif kind == 5:
        body = BinOp("*", Call("tanh", (read(),)), read())
    return Expr(tuple(decls.items()), Scope(trav, summ, body))


SPECIALS = (float("nan"), float("inf"), float("-inf"))


@st.composite
def inputs_with_specials(draw, expr: Expr, max_specials: int = 3) -> dict[str, np.ndarray]:
    """Standard normal float32 inputs for ``expr`` with up to ``max_specials`` elements of each
    tensor (at least one in all) made NaN, +inf or -inf at random positions."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    out = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in expr.decls}
    names = sorted(out)
    forced = draw(st.sampled_from(names)) if names else None
    for name in names:
        flat = out[name].reshape(-1)
        count = draw(st.integers(1 if name == forced else 0, max_specials))
        for _ in range(min(count, flat.size)):
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from(SPECIALS))
    return out


# --------------------------------------------------------------------- expression programs
@st.composite
def expr_programs(draw) -> ExprProgram:
    """A tidy :class:`ExprProgram` of 2-5 defs over small inputs: 1-3 twins ``T0, T1, ...``
    of one :func:`exprs` expression whose first tensor read outside nested scopes is renamed
    per twin (``A0, A1, ...`` when it is ``A``: the holes a merge stacks; the other tensor,
    when drawn, is shared), then maybe an element-wise consumer ``C`` of ``T0`` (adding ``T1``
    when there is one), a layout def ``P`` (a transpose of the last two dimensions, or a
    reversal at rank 1) of the latest def, and a summing consumer ``S`` of ``T0`` (a compute
    -> compute chain). The outputs are the defs nothing reads, maybe with one more."""
    base = draw(exprs(depth=1))
    top = [a.source for a in accesses(base.root.body) if isinstance(a.source, str)]
    hole = top[0] if top else base.decls[0][0]  # a tensor read outside nested scopes
    inputs = {n: s for n, s in base.decls if n != hole}
    defs: list[tuple[str, Expr]] = []
    for k in range(draw(st.sampled_from([2, 1, 2, 3]))):  # mostly twins to merge
        inputs[f"{hole}{k}"] = base.inputs[hole]
        defs.append((f"T{k}", rename_expr(base, {hole: f"{hole}{k}"})))
    shape = base.shape
    its = tuple(Iter(f"i{k}", 0, d) for k, d in enumerate(shape))
    idx = tuple(var(it.name) for it in its)
    extra = draw(st.lists(st.sampled_from("CPS"), unique=True, max_size=3))
    if len(defs) == 1 and not extra:
        extra = ["C"]
    for kind in sorted(extra, key="CPS".index)[: 5 - len(defs)]:
        if kind == "C":
            body: Node = draw(st.sampled_from([
                Call("relu", (Access("T0", idx),)), BinOp("*", Access("T0", idx), Const(2.0)),
                BinOp("-", Call("tanh", (Access("T0", idx),)), Const(1.0))]))
            if len(defs) > 1 and defs[1][0] == "T1":
                body = BinOp("+", body, Access("T1", idx))
            defs.append(("C", Expr((), Scope(its, (), body))))
        elif kind == "P":
            src, shp = defs[-1][0], defs[-1][1].shape
            pits = tuple(Iter(f"i{k}", 0, d) for k, d in enumerate(shp))
            if len(shp) >= 2:
                order = (*pits[:-2], pits[-1], pits[-2])
                move = Access(src, tuple(var(it.name) for it in pits))
            else:
                order = pits
                move = Access(src, (const(shp[0] - 1) - var("i0"),))
            defs.append(("P", Expr((), Scope(order, (), move))))
        else:
            body = BinOp("*", Access("T0", idx), Access("T0", idx))
            defs.append(("S", Expr((), Scope(its[:1], its[1:], body) if len(its) > 1 else
                                   Scope(its, (), body))))
    shapes = dict(inputs)
    full = []
    for name, e in defs:
        full.append((name, Expr(tuple((n, shapes[n]) for n in sorted(tensor_names(e.root))),
                                e.root)))
        shapes[name] = e.shape
    used = set().union(*(tensor_names(e.root) for _, e in full))
    outs = [n for n, _ in full if n not in used]
    more = draw(st.sampled_from([n for n, _ in full]))
    if more not in outs and draw(st.booleans()):
        outs.append(more)
    return ExprProgram(tuple(inputs.items()), tuple(full), tuple(outs)).tidy()


@st.composite
def sum_programs(draw, same_windows: bool = False) -> ExprProgram:
    """A program adding 2-3 one-dimensional convolutions ``T<i> = L<f, h> Sum<c, r>
    A<i>[c, h + r - p<i>] * W<i>[f, c, r]`` (each maybe plus a bias ``B<i>[f]``) over their own
    activations, with drawn channel counts, windows and paddings (equal windows and paddings
    when ``same_windows``), output ``Y = T0 + T1 (+ T2)``: the shape
    :mod:`ollie.rules.inter_sum` merges."""
    n = draw(st.integers(2, 3))
    f, h = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    k0 = draw(st.integers(1, 3))
    inputs: dict[str, tuple[int, ...]] = {}
    defs: list[tuple[str, Expr]] = []
    its = (Iter("f", 0, f), Iter("h", 0, h))
    for i in range(n):
        c = draw(st.integers(1, 3))
        k = k0 if same_windows else draw(st.integers(1, 3))
        p = (k - 1) // 2 if same_windows else draw(st.integers(0, k - 1))
        inputs.update({f"A{i}": (c, h), f"W{i}": (f, c, k)})
        body: Node = BinOp("*", Access(f"A{i}", (var("c"), var("h") + var("r") - p)),
                           Access(f"W{i}", (var("f"), var("c"), var("r"))))
        root = Scope(its, (Iter("c", 0, c), Iter("r", 0, k)), body)
        if draw(st.booleans()):
            inputs[f"B{i}"] = (f,)
            root = Scope(its, (), BinOp("+", Access(root, (var("f"), var("h"))),
                                        Access(f"B{i}", (var("f"),))))
        defs.append((f"T{i}", Expr((), root)))
    total: Node = Access("T0", (var("f"), var("h")))
    for i in range(1, n):
        total = BinOp("+", total, Access(f"T{i}", (var("f"), var("h"))))
    defs.append(("Y", Expr((), Scope(its, (), total))))
    return ExprProgram(tuple(inputs.items()), tuple(defs), ("Y",)).tidy()


@st.composite
def program_inputs(draw, ep: ExprProgram, specials: bool = True) -> dict[str, np.ndarray]:
    """Inputs for ``ep``: :func:`inputs_with_specials` of its inputs (NaN and infinities at
    random positions) when ``specials``, else standard normal values."""
    expr = Expr(tuple(ep.inputs), Scope((Iter("i", 0, 1),), (), Const(0.0)))
    if specials:
        return draw(inputs_with_specials(expr))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return {n: rng.standard_normal(s, dtype=np.float32) for n, s in ep.inputs}


# --------------------------------------------------------------------- linear-region graphs
LINEAR_STEPS = ("conv3x3", "conv1x1", "conv_transpose", "matmul_const", "matmul_acts", "add",
                "sub", "mul_const", "div_const", "neg", "batchnorm", "transpose", "reshape2",
                "avgpool", "concat_conv", "identity")
"""Steps of :func:`linear_graphs` that emit linear nodes (``ollie.graph.partition``)."""
BOUNDARY_STEPS = ("relu", "tanh", "sigmoid", "leaky_relu", "abs", "max_acts", "mul_acts",
                  "maxpool", "softmax")
"""Steps of :func:`linear_graphs` that emit boundary (non-linear or opaque) nodes."""


_BINARY_STEPS = ("matmul_acts", "add", "sub", "concat_conv", "max_acts", "mul_acts")
_STEP_CLASSES = tuple(tuple(s for s in steps if (s in _BINARY_STEPS) == binary)
                      for steps in (LINEAR_STEPS, BOUNDARY_STEPS) for binary in (False, True))


@st.composite
def linear_graphs(draw, max_steps: int = 12) -> Graph:
    """A small random DAG :class:`ollie.graph.Graph` of linear and boundary operators, built
    with the frontends' ``GraphBuilder``: one or two inputs of one shape ``[1, c, h, h]``
    (c 1-3, h 2-4), then 1-``max_steps`` steps (:data:`LINEAR_STEPS`, :data:`BOUNDARY_STEPS`;
    linear or boundary, with one or two operands, each of the four classes equally likely)
    each reading one or two earlier tensors (the latest one more often, so chains, fan-out and
    re-joining branches all occur) and producing one tensor of that shape; random constants.
    The graph outputs are the tensors no step reads, plus maybe one more."""
    from ollie.frontend.builder import GraphBuilder

    c, h = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = GraphBuilder("linear_graph", track_shapes=True)
    acts = [b.add_input(f"x{k}", (1, c, h, h)) for k in range(draw(st.integers(1, 2)))]
    read: set[str] = set()

    def operand() -> str:
        k = len(acts) - 1 if draw(st.booleans()) else draw(st.integers(0, len(acts) - 1))
        read.add(acts[k])
        return acts[k]

    def const(*shape: int, positive: bool = False) -> str:
        v = rng.standard_normal(shape).astype(np.float32)
        return b.add_const(np.abs(v) + 0.5 if positive else v, "w")

    def conv(x: str, cin: int, k: int) -> str:
        return b.emit1("Conv2d", [x, const(c, cin, k, k), const(c)],
                       {"stride": 1, "padding": k // 2}, "conv")

    for _ in range(draw(st.integers(1, max_steps))):
        step = draw(st.sampled_from(draw(st.sampled_from(_STEP_CLASSES))))
        x = operand()
        if step in ("conv3x3", "conv1x1"):
            y = conv(x, c, 3 if step == "conv3x3" else 1)
        elif step == "conv_transpose":
            y = b.emit1("ConvTranspose2d", [x, const(c, c, 3, 3)], {"stride": 1, "padding": 1},
                        "deconv")
        elif step == "matmul_const":
            y = b.emit1("MatMul", [x, const(h, h)], {}, "mm")
        elif step in ("matmul_acts", "add", "sub", "max_acts", "mul_acts"):
            op = {"matmul_acts": "MatMul", "add": "Add", "sub": "Sub", "max_acts": "Max",
                  "mul_acts": "Mul"}[step]
            y = b.emit1(op, [x, operand()], {}, op.lower())
        elif step in ("mul_const", "div_const"):
            y = b.emit1(step[:3].title(), [x, const(positive=True)], {}, step)
        elif step == "batchnorm":
            y = b.emit1("BatchNorm", [x, const(c), const(c), const(c), const(c, positive=True)],
                        {"eps": 1e-5}, "bn")
        elif step == "transpose":
            y = b.emit1("Transpose", [x], {"perm": (0, 1, 3, 2)}, "t")
        elif step == "reshape2":
            y = b.emit1("Reshape", [b.emit1("Reshape", [x], {"shape": (1, c * h, h)}, "r")],
                        {"shape": (1, c, h, h)}, "r")
        elif step in ("avgpool", "maxpool"):
            op = "AvgPool2d" if step == "avgpool" else "MaxPool2d"
            y = b.emit1(op, [x], {"kernel_size": 3, "stride": 1, "padding": 1}, "pool")
        elif step == "concat_conv":
            y = conv(b.emit1("Concat", [x, operand()], {"axis": 1}, "cat"), 2 * c, 1)
        elif step == "softmax":
            y = b.emit1("Softmax", [x], {"axis": 1}, "softmax")
        elif step == "leaky_relu":
            y = b.emit1("LeakyRelu", [x], {"alpha": 0.1}, "lrelu")
        else:
            y = b.emit1(step.title() if step != "identity" else "Identity", [x], {}, step)
        acts.append(y)
    inputs = {name for name, _ in b.inputs}
    outs = [t for t in acts if t not in read and t not in inputs]
    extra = draw(st.sampled_from(acts))
    if extra not in outs and extra not in inputs and draw(st.booleans()):
        outs.append(extra)
    for t in outs or [acts[-1]]:
        b.add_output(t)
    return b.finish()
