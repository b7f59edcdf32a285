"""``ollie derive FILE``: hybrid derivation of one expression file (API.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ollie.errors import OllieError
from ollie.ir import parse
from ollie.search import SearchConfig, derive


class InputError(OllieError):
    """An unreadable input file."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="expression text file (EXPR_SYNTAX.md); '-' reads stdin")
    p.add_argument("--max-depth", type=int, default=7, help="explorative depth (default 7)")
    p.add_argument("--time-budget", type=float, default=60.0,
                   help="seconds for search and verification (default 60)")
    p.add_argument("--max-candidates", type=int, default=SearchConfig.max_candidates,
                   help="verified candidates to report (default %(default)s)")
    p.add_argument("--no-guided", action="store_true", help="disable guided derivation")
    p.add_argument("--no-pruning", action="store_true", help="disable fingerprint pruning")
    p.add_argument("--json", action="store_true", help="print one JSON object (API.md)")
    p.add_argument("--explain", action="store_true",
                   help="print each candidate's derivation step by step")


def _read(path: str) -> tuple[str, str]:
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(path).read_text(), path
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    text, source = _read(args.file)
    expr = parse(text, source=source)
    from ollie.commands.progress import search_progress

    update, close = search_progress(f"deriving {source}", args.time_budget)
    try:
        res = derive(expr, max_depth=args.max_depth, time_budget=args.time_budget,
                     max_candidates=args.max_candidates, guided=not args.no_guided,
                     fingerprint_pruning=not args.no_pruning, progress=update)
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
        rule = "eoperator_generation" if k.kind == "eOp" else "operator_matching"
        n += 1
        detail = k.params.get("expr", "").rstrip().splitlines()[-1] if k.kind == "eOp" else \
            ", ".join(f"{p}={v}" for p, v in k.params.items() if isinstance(v, (int, bool)))
        print(f"  {n}. {rule}: {k.kind} {k.output} <- {', '.join(k.inputs)}")
        print(f"     {detail}")
