"""Python source of numba loop nests: one ``@njit`` function per nest, and the module.

Each nest function takes the flat (1-D, C-contiguous float32) buffers it reads and ``out``. Its
shape (see :mod:`ollie.codegen.analysis` for the classification)::

    for _p in prange(P):                  # fused leading traversal loops (and x blocks)
        i0 = _p // N1 + lo0; i1 = ...     # decomposed
        for i2 in range(lo2, hi2):        # the other outer traversal loops
            _lo, _hi = interior of x      # run-time interval from xlin dims, empty if a guard fails
            for i3 in range(_xa, _lo): BOUNDARY POINT   (checked reads, clamped summations)
            for i3 in range(_lo, _hi): INTERIOR POINT   (no bounds checks)
            for i3 in range(_hi, _xb): BOUNDARY POINT

A serial nest may instead loop over its fused iterators in nested loops (``for _p0 in
range(N0): for _p1 in range(N1): i0 = _p0 + lo0 ...``, ``nested``), the form whose sizes
:mod:`ollie.codegen.pattern` passes as arguments.
When the output's contiguous iterator reads strided and x writes strided (a transpose), it is
looped inside tiles of :data:`~ollie.codegen.analysis.X_TILE` x values (``for _xt``, then it,
then x over the tile). The residue nests of one nest (:mod:`ollie.codegen.residue`) share one
function: its fused loops over their common outer iterators, then each nest's own loops.

A point evaluates the body (one SSA statement per node, equal sub-expressions shared) inside the
summation loops and accumulates, then applies the nest's ``post`` function as it stores, except
for a function of :data:`SEPARATE_POSTS` on residue nests, applied by a flat pass afterwards.
At boundary points a summation loop of at most
:data:`MAX_MASKED_TRIPS` values runs all of them (unrolled) with its reads checked rather than
clamped (run-time loop bounds cost more than the masked reads: 3x3 offset-add 1.5x). A
longer clamped summation loop that has at most
:data:`MAX_MASKED_TRIPS` in-bounds values, fewer than its range (a stride-``k`` selective add),
runs that constant trip count from the clamp's start with a mask on the read. A checked read is
branch-free: ``v = B[np.uint64(off if ok else 0)]; v = v if ok else 0``. Every index is cast
to ``uint64`` (it is never negative there): numba then skips its negative-index wrap-around,
which LLVM cannot remove when the loop index comes from ``prange`` (2x on the offset-add).
Index arithmetic is int64 with Python floor division and modulo (numba follows Python's
semantics for ``//`` and ``%`` on integers).
Functions follow numpy: ``max``/``min``/``relu`` propagate NaN, ``log``/``sqrt`` of negatives
give NaN (``error_model="numpy"``: no exceptions, division by zero gives inf/NaN).
"""

from __future__ import annotations

from dataclasses import replace

from ollie.codegen.analysis import X_TILE, NestInfo
from ollie.codegen.body import Body, Consts
from ollie.codegen.plan import Nest, Plan, residue_groups
from ollie.ir import Affine
from ollie.ir.index import FloorDiv, Var

MAX_MASKED_TRIPS = 8
"""A clamped summation loop with at most this many in-bounds values (fewer than its range) runs
a constant trip count with a mask instead of run-time bounds."""

SEPARATE_POSTS = ("tanh",)
"""Functions of :attr:`~ollie.codegen.plan.Nest.post` applied in a pass of their own over the
target when the nests computing it are residue nests (strided writes: their loops are not
vectorised, so the function would run one value at a time) with a float32 accumulator (the
pass then computes exactly what the fused form does). The pass is one flat loop that LLVM
vectorises. DCGAN b16's last selective add with tanh, [16,3,64,64] from NHWC taps
(``benchmarks/selective_add.py``, 2 cores, warm, docs/design/020-codegen-measurements.md):
0.310 ms fused against 0.146, bit-identical; in DCGAN b16's program 0.61-0.67 -> 0.29 ms."""

POST_BLOCKS = 64
"""The flat post pass runs in this many blocks (in parallel when its nests do)."""

def _trips(it, clamps: list) -> int:
    """The most values of summation iterator ``it`` that ``clamps`` can leave in bounds."""
    return min([it.size, *((c.size - 1) // abs(c.coef) + 1 for c in clamps)])


def render(e: Affine, names: dict[str, str]) -> str:
    """Python text of an index expression (iterators renamed by ``names``)."""
    parts: list[str] = []
    for atom, c in e.terms:
        if isinstance(atom, Var):
            text = names[atom.name]
        else:
            op = "//" if isinstance(atom, FloorDiv) else "%"
            text = f"(({render(atom.arg, names)}) {op} {atom.k})"
        if c == 1:
            parts.append(f"+ {text}")
        elif c == -1:
            parts.append(f"- {text}")
        else:
            parts.append(f"{'+' if c > 0 else '-'} {abs(c)}*{text}")
    if e.const or not parts:
        parts.append(f"{'+' if e.const >= 0 else '-'} {abs(e.const)}")
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


class NestEmitter:
    """Emits the source of one loop nest (:meth:`function`), optionally fused with a group of
    nests over the same grid."""

    def __init__(self, info: NestInfo, consts: Consts) -> None:
        self.info = info
        self.consts = consts
        self.dtype = "float64" if info.acc64 else "float32"
        self.zero = consts.get(0.0, self.dtype)
        self.names = {it.name: f"i{k}" for k, it in enumerate(info.scope.iters)}
        self.lines: list[str] = []
        self.unclamped: set = set()  # clamps replaced by checked reads at the current point

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def idx(self, e: Affine) -> str:
        return render(e, self.names)

    # ------------------------------------------------------------------ the function
    def function(self, name: str, group: tuple[NestEmitter, ...] = (),
                 nested: bool = False) -> str:
        """The nest function; ``group``: emitters of further nests sharing its fused loops.
        ``nested``: a serial nest loops over its fused iterators (and x blocks) in nested
        loops over ``_p0, _p1, ...`` instead of one loop over ``_p`` whose index is
        decomposed (the form :mod:`ollie.codegen.pattern` takes the sizes out of: no division
        per item)."""
        info = self.info
        infos = [info, *(em.info for em in group)]
        params = sorted({r.buffer.ident for i in infos for r in i.reads.values()})
        sig = ", ".join(["float32[::1]"] * (len(params) + 1))
        self.emit(0, f'@njit("void({sig})", parallel={info.parallel}, fastmath=False, '
                     'cache=True, error_model="numpy", boundscheck=False)')
        self.emit(0, f"def {name}({', '.join([*params, 'out'])}):")
        more = f" (and {len(group)} more residue nest(s))" if group else ""
        self.emit(1, '"""' + _doc(info) + more + '"""')
        if info.x is None:
            self.point(1, interior=False)
            return "\n".join(self.lines)
        fused = info.outer[:info.fused]
        items = info.xblocks
        for it in fused:
            items *= it.size
        if nested and not info.parallel:
            self.nested_loops(fused)
            for em in (self, *group):
                em.lines = self.lines
                em.inner_loops(len(fused) + (info.xblocks > 1) + 1)
            return "\n".join(self.lines)
        loop = "prange" if info.parallel else "range"
        self.emit(1, f"for _p in {loop}({items}):")
        # mixed-radix decomposition of _p (fresh names: numba forbids rebinding the index)
        q = "_p"
        if info.xblocks > 1:
            self.emit(2, f"_blk = {q} % {info.xblocks}")
            self.emit(2, f"_q{len(fused)} = {q} // {info.xblocks}")
            q = f"_q{len(fused)}"
        for k, it in reversed(list(enumerate(fused))):
            if k:
                self.emit(2, f"{self.names[it.name]} = {q} % {it.size} + {it.lo}")
                self.emit(2, f"_q{k} = {q} // {it.size}")
                q = f"_q{k}"
            else:
                self.emit(2, f"{self.names[it.name]} = {q} + {it.lo}")
        for em in (self, *group):
            em.lines = self.lines
            em.inner_loops(2)
        return "\n".join(self.lines)

    def nested_loops(self, fused: list) -> None:
        """Serial loops over the fused iterators, then the x blocks, each over ``_pK``."""
        loops = [it.size for it in fused] + ([self.info.xblocks] if self.info.xblocks > 1 else [])
        for k, size in enumerate(loops):
            self.emit(1 + k, f"for _p{k} in range({size}):")
        depth = 1 + len(loops)
        for k, it in enumerate(fused):
            self.emit(depth, f"{self.names[it.name]} = _p{k} + {it.lo}")
        if self.info.xblocks > 1:
            self.emit(depth, f"_blk = _p{len(fused)}")

    def inner_loops(self, depth: int) -> None:
        """The outer traversal loops that are not fused, then the x loops."""
        info = self.info
        for it in info.outer[info.fused:]:
            self.emit(depth, f"for {self.names[it.name]} in range({it.lo}, {it.hi}):")
            depth += 1
        tile, x = info.tile, info.x
        if tile is None or x is None:
            self.x_loops(depth)
            return
        self.emit(depth, f"for _xt in range({-(-x.size // X_TILE)}):  # tiles of x")
        self.emit(depth + 1, f"_xa = {x.lo} + _xt * {X_TILE}")
        self.emit(depth + 1, f"_xb = min(_xa + {X_TILE}, {x.hi})")
        self.emit(depth + 1, f"for {self.names[tile.name]} in range({tile.lo}, {tile.hi}):")
        self.x_loops(depth + 2, ("_xa", "_xb"))

    def x_loops(self, depth: int, tiled: tuple[str, str] | None = None) -> None:
        info = self.info
        x = info.x
        assert x is not None
        xn = self.names[x.name]
        if tiled is not None:
            xa, xb = tiled
        elif info.xblocks > 1:
            block = -(-x.size // info.xblocks)
            self.emit(depth, f"_xa = {x.lo} + _blk * {block}")
            self.emit(depth, f"_xb = min(_xa + {block}, {x.hi})")
            xa, xb = "_xa", "_xb"
        else:
            xa, xb = str(x.lo), str(x.hi)
        if not info.split:
            self.emit(depth, f"for {xn} in range({xa}, {xb}):")
            self.point(depth + 1, interior=False)
            return
        self.interval(depth, xa, xb)
        checked = any(d.kind == "checked" for r in info.reads.values() if not r.zero
                      for d in r.dims)
        label = ("  # interior: checks only where x is under div/mod" if checked else
                 "  # interior: no bounds checks")
        for lo, hi, interior in ((xa, "_lo", False), ("_lo", "_hi", True), ("_hi", xb, False)):
            self.emit(depth, f"for {xn} in range({lo}, {hi}):" +
                      (label if interior else "  # boundary"))
            self.point(depth + 1, interior=interior)

    def interval(self, depth: int, xa: str, xb: str) -> None:
        """``_lo``/``_hi``: the interior of the x loop, from xlin dims and guards.

        Bounds known at generation time are folded into constants (simpler code measurably
        helps LLVM: 1.4x on the offset-add); the others are evaluated per x loop."""
        x = self.info.x
        assert x is not None
        guards: list[str] = []
        bounds: list[tuple[Affine, Affine]] = []
        seen: set[tuple] = set()
        for read in self.info.reads.values():
            if read.zero:
                continue
            for d in read.dims:
                key = (d.kind, d.coef, d.runtime, d.smin, d.smax, d.size)
                if d.kind not in ("xlin", "guard") or key in seen:
                    continue
                seen.add(key)
                low = d.runtime + d.smin  # q >= low + coef*x must be >= 0
                high = (d.size - 1 - d.smax) - d.runtime  # coef*x <= high
                if d.kind == "guard":
                    if d.bounds[0] < 0:
                        guards.append(f"({self.idx(low)} >= 0)")
                    if d.bounds[1] >= d.size:
                        guards.append(f"({self.idx(high)} >= 0)")
                elif d.coef > 0:
                    bounds.append((-(low // d.coef), high // d.coef + 1))
                else:
                    b = -d.coef
                    bounds.append((-(high // b), low // b + 1))
        lo, hi = x.lo, x.hi
        dynamic = []
        for blo, bhi in bounds:
            if blo.is_const and bhi.is_const:
                lo, hi = max(lo, blo.const), min(hi, bhi.const)
            else:
                dynamic.append((blo, bhi))
        lo = min(lo, x.hi)
        hi = max(hi, lo)
        blocked = xa != str(x.lo)
        self.emit(depth, f"_lo = max({xa}, {lo})" if blocked else f"_lo = {lo}")
        self.emit(depth, f"_hi = min({xb}, {hi})" if blocked else f"_hi = {hi}")
        for blo, bhi in dynamic:
            self.emit(depth, f"_lo = max(_lo, {self.idx(blo)})")
            self.emit(depth, f"_hi = min(_hi, {self.idx(bhi)})")
        if dynamic or blocked:
            self.emit(depth, f"_lo = min(_lo, {xb})")
            self.emit(depth, "_hi = max(_hi, _lo)")
        if guards:
            self.emit(depth, f"if not ({' & '.join(guards)}):")
            self.emit(depth + 1, f"_lo = {xb}")
            self.emit(depth + 1, f"_hi = {xb}")

    # ------------------------------------------------------------------ one point
    def point(self, depth: int, interior: bool) -> None:
        info = self.info
        oflat = info.out_flat
        tag = "n" if interior else "b"
        self.unclamped = set()
        post = info.nest.post
        if not info.summation:
            body = Body(self, interior, tag, [])
            stmts, value = body.run(info.scope.body)
            if post is not None:
                value = body.unary(post, value)
            for s in stmts:
                self.emit(depth, s)
            self.emit(depth, f"out[np.uint64({self.idx(oflat)})] = {value}")
            return
        self.emit(depth, f"_acc = {self.zero}")
        clamps = info.clamps(interior)
        # a summation loop of at most MAX_MASKED_TRIPS values that a clamp cannot shorten runs
        # all of them (a constant trip count, unrolled) with its reads checked instead of
        # run-time clamped bounds (boundary points of a 3x3 offset-add: 1.5x on the whole
        # kernel); one whose clamp admits fewer values than its range (a stride-2 selective
        # add: 2 of 8) keeps the clamp's start and runs that shorter count
        self.unclamped = {c for it in info.summation if it.size <= MAX_MASKED_TRIPS
                          and _trips(it, clamps.get(it.name, [])) >= it.size
                          for c in clamps.get(it.name, ())}
        inner = depth
        masks: list[str] = []
        for j, it in enumerate(info.summation):
            name = self.names[it.name]
            cs = [c for c in clamps.get(it.name, []) if c not in self.unclamped]
            if not cs:
                self.emit(inner, f"for {name} in range({it.lo}, {it.hi}):")
                inner += 1
                continue
            self.emit(inner, f"_a{j} = {it.lo}")
            self.emit(inner, f"_b{j} = {it.hi}")
            for c in cs:
                if c.coef > 0:
                    lo, hi = -(c.rest // c.coef), (c.size - 1 - c.rest) // c.coef + 1
                else:
                    b = -c.coef
                    lo, hi = -((c.size - 1 - c.rest) // b), c.rest // b + 1
                self.emit(inner, f"_a{j} = max(_a{j}, {self.idx(lo)})")
                self.emit(inner, f"_b{j} = min(_b{j}, {self.idx(hi)})")
            trips = _trips(it, cs)
            if trips < it.size and trips <= MAX_MASKED_TRIPS:
                # at most `trips` values are in bounds: a constant trip count (unrolled) with a
                # mask beats a run-time bounded loop (1.7x on a stride-2 transposed-conv add)
                self.emit(inner, f"for _t{j} in range({trips}):")
                self.emit(inner + 1, f"{name} = _a{j} + _t{j}")
                masks.append(f"({name} < _b{j})")
            else:
                self.emit(inner, f"for {name} in range(_a{j}, _b{j}):")
            inner += 1
        stmts, value = Body(self, interior, tag, masks).run(info.scope.body)
        for s in stmts:
            self.emit(inner, s)
        self.emit(inner, f"_acc += {value}")
        value = "_acc"
        if post is not None:
            body = Body(self, interior, tag + "p", [])
            value = body.unary(post, value)
            for s in body.stmts:
                self.emit(depth, s)
        self.emit(depth, f"out[np.uint64({self.idx(oflat)})] = {value}")


def _doc(info: NestInfo) -> str:
    target = info.nest.target.ident
    kinds: dict[str, int] = {}
    for r in info.reads.values():
        for d in r.dims:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
    summary = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
    acc = "float64" if info.acc64 else "float32"
    return (f"Computes {target}: {len(info.reads)} distinct read(s), dims {summary}; "
            f"split={info.split}, clampable={info.clampable}, accumulator {acc}.")


def _separate_posts(infos: list[NestInfo]) -> tuple[list[NestInfo], dict[int, NestInfo]]:
    """``infos`` with the functions of :data:`SEPARATE_POSTS` taken off runs of residue nests
    writing one target, and, by the index of each run's last nest, that nest's original info
    (whose ``post`` the pass after it applies)."""
    infos = list(infos)
    passes: dict[int, NestInfo] = {}
    k = 0
    while k < len(infos):
        nest = infos[k].nest
        j = k + 1
        while j < len(infos) and infos[j].nest.target == nest.target \
                and infos[j].nest.post == nest.post:
            j += 1
        run = infos[k:j]
        if nest.post in SEPARATE_POSTS and all(i.nest.out_index is not None and not i.acc64
                                               for i in run):
            infos[k:j] = [replace(i, nest=replace(i.nest, post=None)) for i in run]
            passes[j - 1] = run[-1]
        k = j
    return infos, passes


def _post_function(name: str, info: NestInfo, consts: Consts) -> str:
    """A flat pass applying ``info.nest.post`` to every element of its target, in place."""
    em = NestEmitter(info, consts)
    size = info.nest.target.size
    blocks = max(1, min(POST_BLOCKS, size))
    step = -(-size // blocks)
    body = Body(em, True, "q", [])
    value = body.unary(info.nest.post, "_x")
    em.emit(0, '@njit("void(float32[::1])", parallel=' + str(info.parallel)
            + ', fastmath=False, cache=True, error_model="numpy", boundscheck=False)')
    em.emit(0, f"def {name}(out):")
    em.emit(1, f'"""Applies {info.nest.post} to {info.nest.target.ident} in place '
               '(after its residue nests)."""')
    em.emit(1, f"for _p in {'prange' if info.parallel else 'range'}({blocks}):")
    em.emit(2, f"for i in range(_p * {step}, min(_p * {step} + {step}, {size})):")
    em.emit(3, "_x = out[np.uint64(i)]")
    for st in body.stmts:
        em.emit(3, st)
    em.emit(3, f"out[np.uint64(i)] = {value}")
    return "\n".join(em.lines)


def emit_module(plan: Plan, infos: list[NestInfo], header: dict[str, str],
                nested: bool = False) -> str:
    """Source of the kernel module: constants, nest functions and the ``run`` driver
    (``nested``: serial nests in nested loops, :meth:`NestEmitter.function`)."""
    consts = Consts()
    consts.get(0.0, "float32")
    funcs: list[str] = []
    calls: list[tuple[int, Nest, list[NestInfo]]] = []
    post_calls: dict[int, tuple[str, str]] = {}  # by index in calls: (function, target)
    infos, passes = _separate_posts(infos)
    for k, j in residue_groups(plan.nests):
        group = tuple(NestEmitter(info, consts) for info in infos[k + 1:j])
        funcs.append(NestEmitter(infos[k], consts).function(f"nest_{len(funcs)}", group,
                                                             nested))
        calls.append((len(funcs) - 1, plan.nests[k], infos[k:j]))
        last = next((i for i in range(k, j) if i in passes), None)
        if last is not None:
            name = f"post_{len(post_calls)}"
            funcs.append(_post_function(name, passes[last], consts))
            post_calls[len(calls) - 1] = (name, passes[last].nest.target.ident)
    lines = ['"""Generated by ollie.codegen.cpu (do not edit).', ""]
    lines += ["    " + ln for ln in header["text"].splitlines()]
    lines += ['"""', "", "import numpy as np", "from numba import njit, prange  # noqa: F401", ""]
    lines += [f"{k} = {v!r}" for k, v in header.items() if k != "text"]
    lines.append(f"INPUTS = {tuple(b.input_name for b in plan.inputs)!r}")
    lines += consts.lines()
    lines.append("")
    for f in funcs:
        lines += ["", f, ""]
    params = [b.ident for b in plan.inputs]
    lines += ["", f"def run({', '.join([*params, 'out'])}):"]
    lines.append('    """Runs the nests in order (flat float32 buffers)."""')
    for b in plan.temps:
        lines.append(f"    {b.ident} = np.empty({b.size}, np.float32)")
    for c, (k, nest, members) in enumerate(calls):
        args = sorted({r.buffer.ident for info in members for r in info.reads.values()})
        lines.append(f"    nest_{k}({', '.join([*args, nest.target.ident])})")
        if c in post_calls:
            lines.append(f"    {post_calls[c][0]}({post_calls[c][1]})")
    return "\n".join(lines) + "\n"
