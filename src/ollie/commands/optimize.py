"""``ollie optimize MODEL`` (an .onnx path or ``zoo:NAME``), ``ollie run OUT``, ``ollie zoo``."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ollie.errors import OllieError

if TYPE_CHECKING:
    import torch

    from ollie.optimizer.report import SubprogramReport


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path/to/model.onnx, zoo:NAME (see 'ollie zoo'), or tv:NAME / "
                   "hf:NAME (torchvision / transformers, optional extra 'models')")
    p.add_argument("--batch", type=int, default=1, help="batch size (zoo models; default 1)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("-o", "--output", default=None,
                   help="folder to save the optimised program (default: NAME.ollie)")
    p.add_argument("--time-budget", type=total_budget_arg, default="auto", metavar="S",
                   help="total seconds for the whole model, every phase included (default "
                        "'auto': 30 s + 1.25 s per distinct subprogram, at most 120 s; 'none': "
                        "no limit): each distinct subprogram searches for a share of what is "
                        "left, at most --subprogram-budget; once spent, the rest keep their "
                        "original operators (or a cached decision) and the best program so "
                        "far is returned")
    p.add_argument("--subprogram-budget", type=float, default=30.0, metavar="S",
                   help="search seconds per distinct subprogram at most (default 30)")
    p.add_argument("--max-depth", type=int, default=2, help="explorative depth (default 2)")
    p.add_argument("--guided-depth", type=int, default=None,
                   help="guided steps per scope toward library operators (default: "
                        "OptimizeConfig's, 6)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--explain", action="store_true",
                   help="print each subprogram's nodes and derivation (inter-expression rules, "
                        "then the derivation of its expression)")
    p.add_argument("--no-kernel-library", dest="kernel_library", action="store_false",
                   help="run on the vendor libraries only (oneDNN, MKL, PyTorch, ONNX "
                        "Runtime), without Ollie's hand-written kernels (Winograd, blocked "
                        "GEMM, band kernels, max pooling)")
    p.add_argument("--no-derivation", dest="derivation", action="store_false",
                   help="keep every subprogram's original operator (no search)")


def total_budget_arg(text: str) -> float | str | None:
    """A ``--time-budget`` value: seconds, ``auto`` (the default budget,
    :func:`ollie.optimizer.budget.default_total`) or ``none`` (no limit)."""
    word = text.strip().lower()
    if word in ("auto", "none"):
        return None if word == "none" else "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a number of seconds, 'auto' or 'none'") from None


def load_model(spec: str, batch: int) -> tuple[object, tuple[torch.Tensor, ...] | None, str]:
    """(model, example inputs or None, a short name) for ``zoo:NAME``, ``tv:NAME``,
    ``hf:NAME`` (optional model suites, :mod:`ollie.zoo.external`) or an ONNX path."""
    if spec.startswith(("tv:", "hf:")):
        from ollie.zoo.external import build

        module, inputs = build(spec, batch)
        return module, tuple(inputs), spec.replace(":", "-")
    if spec.startswith("zoo:"):
        import ollie.zoo

        name = spec[4:]
        if name not in ollie.zoo.MODELS:
            raise OllieError(f"unknown zoo model '{name}' (known: {', '.join(ollie.zoo.MODELS)})")
        module, inputs = ollie.zoo.get(name, batch=batch)
        return module, tuple(inputs), name
    path = Path(spec)
    if not path.is_file():
        raise OllieError(f"{spec}: no such model file")
    return str(path), None, path.stem


def run(args: argparse.Namespace) -> int:
    from ollie.commands.progress import optimize_progress
    from ollie.optimizer.model import optimize

    model, inputs, name = load_model(args.model, args.batch)
    progress, close = optimize_progress(
        f"optimizing {name}", args.time_budget if isinstance(args.time_budget, float) else None)
    try:
        opt = optimize(model, inputs, device=args.device, time_budget=args.subprogram_budget,
                       total_budget=args.time_budget, max_depth=args.max_depth,
                       **({} if args.guided_depth is None else
                          {"guided_depth": args.guided_depth}),
                       progress=progress, kernel_library=args.kernel_library,
                       derivation=args.derivation)
    finally:
        close()
    out = Path(args.output or f"{name}.ollie")
    opt.save(out)
    if args.json:
        print(json.dumps({"model": name, "output": str(out),
                          "report": [r.to_json() for r in opt.report], "notes": opt.notes}))
    else:
        print(opt.summary())
        if args.explain:
            print(explain(opt.report))
        print(f"saved to {out}")
    return 0


def explain(report: Sequence[SubprogramReport]) -> str:
    """Each subprogram of ``report``: the graph nodes it covers, the inter-expression rules
    applied to them (:data:`ollie.rules.inter.INTER_RULES`, e.g. ``expression_merging``),
    then the rules of its expression's derivation, and the program chosen."""
    from ollie.rules.inter import INTER_RULES

    lines = []
    for r in report:
        steps = list(r.derivation)
        inter = 0
        while inter < len(steps) and steps[inter] in INTER_RULES:
            inter += 1
        lines += [f"{r.node} ({r.op}): nodes {', '.join(r.nodes)}",
                  f"  inter-expression: {', '.join(steps[:inter]) or '-'}",
                  f"  derivation: {', '.join(steps[inter:]) or '-'}",
                  f"  program: {r.chosen}"]
        if r.not_kept:
            lines.append(f"  not kept in the program: {r.not_kept['program']} "
                         f"({', '.join(r.not_kept.get('derivation', [])) or '-'})")
    return "\n".join(lines)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="folder written by 'ollie optimize'")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--repeats", type=int, default=20)


def run_program(args: argparse.Namespace) -> int:
    import torch

    import ollie
    from ollie.tune.measure import measure

    opt = ollie.load(args.program, device=args.device)
    feeds = [torch.randn(s, device=args.device) for _, s in opt.program.inputs]
    t0 = time.perf_counter()
    out = opt(*feeds)
    first = time.perf_counter() - t0
    secs = measure(lambda: opt(*feeds), args.device, repeats=args.repeats)
    from torch.utils._pytree import tree_leaves  # the model's containers (a dict, ...)

    shapes = ", ".join(str(list(o.shape)) for o in tree_leaves(out)
                       if isinstance(o, torch.Tensor))
    print(f"{args.program}: {len(opt.program.kernels)} kernels, output {shapes}; first run "
          f"{first * 1e3:.2f} ms, median {secs * 1e3:.3f} ms over {args.repeats} runs")
    return 0


def run_zoo(args: argparse.Namespace) -> int:
    import ollie.zoo

    for name, spec in ollie.zoo.MODELS.items():
        print(f"{name:12} {getattr(spec, 'description', '')}")
    return 0
