"""``ollie derive FILE``: hybrid derivation of one expression file (API.md).

Bad input (a file that cannot be read, is larger than :data:`MAX_FILE_BYTES`, is not UTF-8
text, does not parse, or holds an expression the search cannot take, e.g. inputs too large to
verify on) raises an :class:`~ollie.errors.OllieError` whose message names the file (and the
line and column where there is one); the CLI prints it on one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from ollie.errors import ConfigError, OllieError
from ollie.ir import parse
from ollie.program.params import EOpParams

MAX_FILE_BYTES = 16 << 20
"""Largest expression file read (16 MiB: expression texts are a few lines long)."""


class InputError(OllieError):
    """An unreadable input file."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="expression text file (EXPR_SYNTAX.md); '-' reads stdin")
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
