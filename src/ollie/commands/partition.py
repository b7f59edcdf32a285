"""``python -m ollie.commands.partition MODEL``: the linear-region partition of a model
(:func:`ollie.graph.partition.partition`) and what it costs.

MODEL is ``zoo:NAME`` or a path to an ONNX file. The model is imported the way the optimizer
imports it (:func:`ollie.optimizer.model.to_graph`: identities removed, BatchNorm folded) and
partitioned; the command prints the node count, the items (regions and single nodes), the
histograms of region sizes, compute operators and outputs, and the partition time (the median
of ``--repeat`` runs). ``--list`` also prints every item.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence

from ollie.errors import OllieError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="zoo:NAME or path/to/model.onnx")
    p.add_argument("--batch", type=int, default=1, help="batch size (zoo models; default 1)")
    p.add_argument("-O", "--option", action="append", default=[], metavar="KEY=INT",
                   help="a zoo model option, e.g. -O seq=1024 (Longformer)")
    p.add_argument("--max-nodes", type=int, default=None)
    p.add_argument("--max-compute", type=int, default=None)
    p.add_argument("--max-outputs", type=int, default=None)
    p.add_argument("--max-group", type=int, default=None)
    p.add_argument("--repeat", type=int, default=5, help="timed partition runs (default 5)")
    p.add_argument("--list", action="store_true", help="print every item")


def _histogram(values: Sequence[int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(Counter(values).items())) or "-"


def run(args: argparse.Namespace) -> int:
    import ollie.zoo
    from ollie.graph.partition import Region, RegionLimits, partition
    from ollie.optimizer.model import to_graph

    from .optimize import load_model

    options: dict[str, int] = {}
    for opt in args.option:
        key, sep, value = opt.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise OllieError(f"--option {opt!r}: expected KEY=INT")
        options[key] = int(value)
    start = time.perf_counter()
    if options:
        if not args.model.startswith("zoo:"):
            raise OllieError("--option applies to zoo models only")
        module, example = ollie.zoo.get(args.model, batch=args.batch, **options)
        graph = to_graph(module, example)
    else:
        model, inputs, _ = load_model(args.model, args.batch)
        graph = to_graph(model, inputs)
    import_s = time.perf_counter() - start
    given = {k: getattr(args, k) for k in ("max_nodes", "max_compute", "max_outputs",
                                            "max_group") if getattr(args, k) is not None}
    limits = RegionLimits(**given)
    times = []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        items = partition(graph, limits)
        times.append(time.perf_counter() - t0)
    regions = [it for it in items if isinstance(it, Region)]
    several = [r for r in regions if len(r.nodes) > 1]
    in_regions = sum(len(r.nodes) for r in regions)
    print(f"{args.model} batch {args.batch}{''.join(f' {k}={v}' for k, v in options.items())}: "
          f"{len(graph.nodes)} nodes ({sum(r.compute for r in regions)} compute) -> "
          f"{len(items)} items: {len(regions)} regions ({len(several)} of several nodes), "
          f"{len(items) - len(regions)} single nodes")
    print(f"  nodes in regions: {in_regions}; {limits}")
    print(f"  region sizes (nodes:count): {_histogram([len(r.nodes) for r in regions])}")
    print(f"  compute per region:         {_histogram([r.compute for r in regions])}")
    print(f"  outputs per region:         {_histogram([len(r.outputs) for r in regions])}")
    print(f"  partition {statistics.median(times) * 1e3:.2f} ms (median of {len(times)}), "
          f"import {import_s:.1f} s")
    if args.list:
        for it in items:
            print(f"    {it}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m ollie.commands.partition``."""
    parser = argparse.ArgumentParser(prog="python -m ollie.commands.partition",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except OllieError as exc:
        print(f"partition: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
