"""``ollie derive FILE``: hybrid derivation of one expression file (API.md), or of an
expression program file (the program syntax, :mod:`ollie.ir.program_text`).

A program file is normalised (:func:`~ollie.rules.inter_program.normalize_program`), the
inter-expression rules are applied one step (every derived program is listed with its rule),
the best-looking program is chosen (:func:`best_looking`) and each of its defs is derived as a
single expression, the time budget split over the defs (:func:`def_budgets`); the best
candidate of each def is printed (``--json``: one object with a ``defs`` list).

Bad input (a file that cannot be read, is larger than :data:`MAX_FILE_BYTES`, is not UTF-8
text, does not parse, or holds an expression the search cannot take, e.g. inputs too large to
verify on) raises an :class:`~ollie.errors.OllieError` whose message names the file (and the
line and column where there is one); the CLI prints it on one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ollie.errors import ConfigError, OllieError
from ollie.ir import (
    Scope,
    accesses,
    format_expr,
    format_program,
    is_program_text,
    parse,
    parse_program,
)
from ollie.ir.exprprogram import ExprProgram
from ollie.program.params import EOpParams

MAX_EXTRA_WORK = 0.1
"""How much more reduction work than the original (a fraction of :func:`summed_points`) a
program may do and still be chosen by :func:`best_looking`
(docs/design/025-program-text.md)."""

FIXED_SHARE = 0.2
"""Share of a program's time budget split evenly over its defs; the rest is split in
proportion to the defs' FLOPs (a def without FLOPs to speak of still gets its turn)."""

MAX_FILE_BYTES = 16 << 20
"""Largest expression file read (16 MiB: expression texts are a few lines long)."""


class InputError(OllieError):
    """An unreadable input file."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="expression text file (EXPR_SYNTAX.md) or expression program "
                   "file (NAME = <scope> defs, then 'out NAME, ...'); '-' reads stdin")
    p.add_argument("--max-depth", type=int, default=7, help="explorative depth (default 7)")
    p.add_argument("--time-budget", type=float, default=60.0,
                   help="seconds for search and verification (default 60)")
    p.add_argument("--max-candidates", type=int, default=None,
                   help="verified candidates to report (default: SearchConfig.max_candidates)")
    p.add_argument("--no-guided", action="store_true", help="disable guided derivation")
    p.add_argument("--no-pruning", action="store_true", help="disable fingerprint pruning")
    p.add_argument("--json", action="store_true", help="print one JSON object (API.md)")
    p.add_argument("--explain", action="store_true",
                   help="print each candidate's derivation step by step")


def _read(path: str) -> tuple[str, str]:
    """The text of ``path`` ('-': stdin) and the name to report it by."""
    source = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            if stream is None:  # a text stream (tests replace stdin)
                return sys.stdin.read(), source
            data = stream.read(MAX_FILE_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{source}: cannot read: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8-sig"), source
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        col = len(data[start:exc.start].decode("utf-8", errors="replace")) + 1
        raise InputError(f"{source}:{line}:{col}: cannot read: not UTF-8 text (byte "
                         f"0x{data[exc.start]:02x})") from None


def run(args: argparse.Namespace) -> int:
    text, source = _read(args.file)
    if is_program_text(text):
        return run_program(args, text, source)
    expr = parse(text, source=source)
    from ollie.commands.progress import search_progress
    from ollie.search import SearchConfig, derive

    update, close = search_progress(f"deriving {source}", args.time_budget)
    limit = SearchConfig.max_candidates if args.max_candidates is None else args.max_candidates
    try:
        res = derive(expr, max_depth=args.max_depth, time_budget=args.time_budget,
                     max_candidates=limit, guided=not args.no_guided,
                     fingerprint_pruning=not args.no_pruning, progress=update)
    except ConfigError:
        raise  # a bad option: not about the file
    except OllieError as exc:  # the expression is too large, unsupported, ...: name the file
        raise InputError(f"{source}: {exc}") from exc
    finally:
        close()
    if args.json:
        print(json.dumps(res.to_json(), default=str))
        return 0
    _print_summary(res)
    if args.explain:
        for i, cand in enumerate(res.candidates):
            _explain(i, cand)
    return 0


def _print_summary(res) -> None:
    s = res.stats
    print(f"states visited {s['states_visited']}, pruned {s['states_pruned']}, "
          f"candidates {s['candidates']} (found {s['candidates_found']}), "
          f"depth {s['max_depth']}, {s['seconds']:.1f} s")
    if not res.candidates:
        print("no candidate beyond the original expression")
        return
    print(f"{'#':>3}  {'est. ms':>9}  {'verified':8}  program")
    for i, c in enumerate(res.candidates):
        ok = f"yes {c.max_error:.0e}" if c.verified else "no"
        print(f"{i:>3}  {c.cost * 1e3:9.3f}  {ok:8}  {c.summary()}")


def _explain(i: int, cand) -> None:
    print(f"\ncandidate {i}: {cand.summary()}")
    n = 0
    for step in cand.steps:
        if not step.expr:
            continue
        n += 1
        print(f"  {n}. {step.rule}: {step.note}")
        print("     " + step.expr.rstrip().splitlines()[-1])
    for k in cand.kernels:
        p = k.params
        rule = "eoperator_generation" if isinstance(p, EOpParams) else "operator_matching"
        n += 1
        detail = (p.expr or "").rstrip().splitlines()[-1] if isinstance(p, EOpParams) else \
            ", ".join(f"{q}={v}" for q, v in p.items() if isinstance(v, (int, bool)))
        print(f"  {n}. {rule}: {k.kind} {k.output} <- {', '.join(k.inputs)}")
        print(f"     {detail}")


# --------------------------------------------------------------------- program files
def summed_points(scope: Scope) -> int:
    """Iteration points (traversal x summation) of every scope with a ``Sum`` in ``scope``,
    nested scopes included, counted once per read site: the reduction work a program does,
    which inlining a def into several readers multiplies and merging keeps."""
    own = math.prod(it.size for it in scope.iters) if scope.summation else 0
    return own + sum(summed_points(a.source) for a in accesses(scope.body)
                     if isinstance(a.source, Scope))


def best_looking(programs: list[ExprProgram]) -> int:
    """The index of the best-looking program: among those whose reduction work
    (:func:`summed_points`) exceeds the first program's by at most :data:`MAX_EXTRA_WORK`
    (inlining a def into several readers computes it several times), the one with the fewest
    defs holding a ``Sum`` (the likely library kernels: a merge makes three one), then the
    least work, then the fewest defs; the first of equals."""
    from ollie.rules.inter_program import has_sum

    work = [sum(summed_points(e.root) for _, e in ep.defs) for ep in programs]

    def key(k: int) -> tuple[bool, int, int, int, int]:
        ep = programs[k]
        return (work[k] > (1 + MAX_EXTRA_WORK) * work[0],
                sum(has_sum(e.root) for _, e in ep.defs), work[k], len(ep.defs), k)

    return min(range(len(programs)), key=key)


def def_budgets(ep: ExprProgram, time_budget: float) -> list[float]:
    """Seconds for each def of ``ep``: :data:`FIXED_SHARE` of ``time_budget`` split evenly,
    the rest in proportion to each def's FLOPs. The shares sum to ``time_budget``."""
    from ollie.match.eop import scope_flops

    flops = [scope_flops(e.root) for _, e in ep.defs]
    total, n = sum(flops), len(flops)
    if not total:
        return [time_budget / n] * n
    return [time_budget * (FIXED_SHARE / n + (1 - FIXED_SHARE) * f / total) for f in flops]


def run_program(args: argparse.Namespace, text: str, source: str) -> int:
    """``ollie derive`` of a program file (see the module doc)."""
    from ollie.commands.progress import search_progress
    from ollie.rules.inter_program import apply_program_rules, normalize_program
    from ollie.search import SearchConfig, derive

    ep = parse_program(text, source=source)
    try:
        norm = normalize_program(ep)
        derived = apply_program_rules(norm)
    except OllieError as exc:
        raise InputError(f"{source}: {exc}") from exc
    programs = [norm] + [normalize_program(d.program) for d in derived]
    chosen = best_looking(programs)
    best = programs[chosen]
    limit = SearchConfig.max_candidates if args.max_candidates is None else args.max_candidates
    results = []
    for (name, expr), budget in zip(best.defs, def_budgets(best, args.time_budget),
                                    strict=True):
        update, close = search_progress(f"deriving {source}: {name}", budget)
        try:
            res = derive(expr, max_depth=args.max_depth, time_budget=budget,
                         max_candidates=limit, guided=not args.no_guided,
                         fingerprint_pruning=not args.no_pruning, progress=update)
        except ConfigError:
            raise  # a bad option: not about the file
        except OllieError as exc:
            raise InputError(f"{source}: def {name}: {exc}") from exc
        finally:
            close()
        results.append((name, expr, budget, res))
    steps = [{"rule": d.rule, "note": d.note} for d in derived]
    if args.json:
        print(json.dumps({
            "program": format_program(ep), "normalized": format_program(norm),
            "derived": [dict(s, program=format_program(d.program))
                        for s, d in zip(steps, derived, strict=True)],
            "chosen": {"index": chosen, "derivation": [] if chosen == 0 else
                       [steps[chosen - 1]["rule"]], "program": format_program(best)},
            "defs": [{"name": n, "expr": format_expr(e), "time_budget": b, **r.to_json()}
                     for n, e, b, r in results]}, default=str))
        return 0
    _print_program(ep, norm, steps, chosen, best, results, args.explain)
    return 0


def _print_program(ep, norm, steps, chosen, best, results, explain: bool) -> None:
    print(f"program: {len(ep.inputs)} inputs, {len(ep.defs)} defs "
          f"({len(norm.defs)} after normalisation), outputs {', '.join(ep.outputs)}")
    print(f"inter-expression rules, one step: {len(steps)} programs")
    print(f"{'#':>3}  program")
    print(f"{0:>3}  normalised original")
    for i, s in enumerate(steps, 1):
        print(f"{i:>3}  {s['rule']}: {s['note']}")
    what = "the normalised original" if chosen == 0 else steps[chosen - 1]["rule"]
    print(f"chosen: #{chosen} ({what}), normalised:")
    for line in format_program(best).splitlines():
        print(f"    {line}")
    for name, _, budget, res in results:
        s = res.stats
        print(f"def {name}: budget {budget:.1f} s, states visited {s['states_visited']}, "
              f"candidates {s['candidates']}, {s['seconds']:.1f} s")
        if not res.candidates:
            print("    no candidate beyond the original expression")
            continue
        c = res.candidates[0]
        ok = f"verified {c.max_error:.0e}" if c.verified else "not verified"
        print(f"    best: {c.summary()}  (est. {c.cost * 1e3:.3f} ms, {ok}; "
              f"{', '.join(dict.fromkeys(c.derivation)) or 'no rewrite'})")
        if explain:
            _explain(0, c)
