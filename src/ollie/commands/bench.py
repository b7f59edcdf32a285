"""``ollie bench {search,ops,models}``: the benchmarks (tables and plots under
benchmarks/results/)."""

from __future__ import annotations

import argparse

from ollie.commands.optimize import total_budget_arg


def _depths(text: str) -> range:
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    s = sub.add_parser("search", help="search states/time per depth, pruning and guided "
                                      "derivation ablations")
    s.add_argument("--cases", nargs="+", default=None,
                   help="operator cases (default: conv3x3 convtranspose conv5x5 g2bmm)")
    s.add_argument("--depths", type=_depths, default=range(1, 9), help="e.g. 1-8 (default)")
    s.add_argument("--budget", type=float, default=30.0, help="seconds per run (default 30)")
    s.add_argument("--configs", nargs="+", default=None,
                   help="configurations: hybrid, explorative, 'hybrid, no pruning', "
                        "'explorative, no pruning' (default: all four)")
    s.add_argument("--out", default="benchmarks/results", help="output folder")
    s.add_argument("--random-shapes", type=_positive, default=None, metavar="N",
                   help="instead: N random shapes per case family, one search each to the "
                        "deepest of --depths, as ollie.optimize searches (8 candidates), "
                        "reporting per family how often the target was found and reported, "
                        "and the median / p95 time to find it")
    s.add_argument("--seed", type=int, default=0, help="seed of --random-shapes (default 0)")


    o = sub.add_parser("ops", help="operator-level benchmark (the paper's Table 3)")
    o.add_argument("--cases", nargs="+", default=None,
                   help="cases (default: conv3x3 convtranspose conv5x5 g2bmm)")
    o.add_argument("--budget", type=float, default=60.0, help="search seconds per case")
    o.add_argument("--device", default="cpu", help="cpu or cuda")
    o.add_argument("--out", default="benchmarks/results", help="output folder")

    m = sub.add_parser("models", help="end-to-end benchmark of the zoo models against "
                                      "PyTorch eager, torch.compile and ONNX Runtime")
    m.add_argument("--models", nargs="+", default=None,
                   help="zoo models (default: all seven); cnn:NAME for an architecture of "
                        "ollie.testing.cnns (cnn:all: all twelve); tv:NAME / hf:NAME for "
                        "torchvision / transformers models (tv:all, hf:all: the suites; "
                        "extra 'models')")
    m.add_argument("--batches", nargs="+", type=int, default=[1, 16],
                   help="batch sizes (default: 1 16)")
    m.add_argument("--budget", "--subprogram-budget", dest="budget", type=float, default=20.0,
                   metavar="S", help="search seconds per distinct subprogram (default 20)")
    m.add_argument("--time-budget", type=total_budget_arg, default="auto", metavar="S",
                   help="total seconds for each optimisation of a model, as 'ollie optimize "
                        "--time-budget' (default 'auto': scaled with its subprograms; 'none': "
                        "no limit)")
    m.add_argument("--out", default="benchmarks/results", help="output folder")
    m.add_argument("--keep", action="store_true",
                   help="keep other models' rows already in OUT/models.json")
    m.add_argument("--cache-dir", default=None,
                   help="persistent cache folder (default: a fresh one: cold optimisation)")
    m.add_argument("--threads", type=int, default=None,
                   help="intra-op threads of every system (default: cores)")
    m.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where models and programs run (default cpu; cuda writes models_cuda.*)")
    m.add_argument("--repeats", type=_positive, default=1,
                   help="alternating timings per model and batch: the table gives their "
                        "medians and the notes the range of Ollie's speedups (default 1)")
    m.add_argument("--attribution", action="store_true",
                   help="also optimise and time, in the same run, the original operators on "
                        "the vendor libraries only (0), derived programs on them (a) and the "
                        "original operators on Ollie's kernel library (b); the report gets "
                        "their speedups over (0) next to Ollie's (c)")
    m.add_argument("--compile-mode", default=None,
                   choices=("default", "reduce-overhead", "max-autotune",
                            "max-autotune-no-cudagraphs"),
                   help="torch.compile's mode for its peer (default: 'default' on the CPU, "
                        "'max-autotune' on CUDA)")
    m.add_argument("--no-new-process-warm", dest="new_process", action="store_false",
                   help="skip the warm optimisation in a new process (the table's warm "
                        "column then has the same-process figure only)")
    m.add_argument("--cpu-time", action="store_true",
                   help="time by the CPU time of the calling thread, every system on one "
                        "thread (implies --threads 1; CPU only): on a machine that other "
                        "processes keep busy, waiting for a core is not counted")


def run(args: argparse.Namespace) -> int:
    if args.bench == "search" and args.random_shapes:
        from ollie.bench import search_random
        from ollie.bench.shapes import FAMILIES

        return search_random.main(args.random_shapes, tuple(args.cases or FAMILIES),
                                  max(args.depths), args.budget, args.out, args.seed)
    if args.bench == "search":
        from ollie.bench import search

        return search.main(tuple(args.cases or search.DEFAULT_CASES), args.depths, args.budget,
                           args.out, tuple(args.configs or search.CONFIGS))
    if args.bench == "ops":
        from ollie.bench import ops

        return ops.main(tuple(args.cases or ops.DEFAULT_CASES), args.budget, args.device,
                        args.out)
    if args.bench == "models":
        from ollie.bench import models

        return models.main(models.expand(args.models or models.DEFAULT_MODELS), tuple(args.batches),
                           args.budget, args.out, args.keep, args.cache_dir,
                           args.threads, device=args.device, repeats=args.repeats,
                           attribution=args.attribution, total_budget=args.time_budget,
                           cpu_time=args.cpu_time, compile_mode=args.compile_mode,
                           new_process=args.new_process)
    raise AssertionError(args.bench)
