"""Coverage check of one ``tv:NAME`` / ``hf:NAME`` model (ollie.zoo.external).

    python benchmarks/coverage_tv_hf.py import SPEC [KEY=VALUE ...]
    python benchmarks/coverage_tv_hf.py opt|compile|both SPEC [KEY=VALUE ...]

``import``: from_torch (identities removed, BatchNorm folded), every opaque node with the
reason the importer logged ("no converter" where it logged none), and the graph run by the
reference executor against the module on the model's example input (relative error in the
2-norm). ``opt`` / ``compile`` / ``both``: ``ollie.optimize`` and / or
``torch.compile(backend="ollie")`` with a tiny search (time_budget 0.5 s, max_depth 1,
max_candidates 2, settle 0, no program-context step), the relative error of the result on the
example input, the wall time, and Ollie's warnings (a backend warning "running the graph
unchanged" is a refusal of that graph). Needs torchvision / transformers (extra 'models').
"""

from __future__ import annotations

import logging
import re
import sys
import time
import traceback
import warnings
from collections import Counter

import torch

import ollie
from ollie.frontend import from_torch
from ollie.graph.execute import run_graph
from ollie.graph.ir import OPAQUE
from ollie.graph.passes import eliminate_identity, fold_batchnorm
from ollie.optimizer import backend
from ollie.optimizer.model import OptimizeConfig
from ollie.zoo.external import build

TINY = OptimizeConfig(time_budget=0.5, max_depth=1, max_candidates=2, settle=0, context=False)


class _Log(logging.Handler):
    OPAQUE = re.compile(r"fx node '([^']+)' \((.*?)\) kept opaque: (.*)")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, str] = {}
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        m = self.OPAQUE.match(text)
        if m:
            self.reasons[m.group(1)] = m.group(3)
        elif record.levelno >= logging.WARNING:
            self.warnings.append(text[:300])


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def check_import(spec: str, module: torch.nn.Module, x: tuple, ref: torch.Tensor,
                 log: _Log) -> None:
    t = time.time()
    graph = fold_batchnorm(eliminate_identity(from_torch(module, x)))
    seconds = time.time() - t
    reasons: Counter[str] = Counter()
    for n in graph.nodes:
        if n.op == OPAQUE:
            target = str(n.attrs.get("target", n.attrs.get("op_type", "?")))
            reasons[f"{target}: {log.reasons.get(n.name, 'no converter')}"] += 1
        elif n.opaque:
            reasons[f"{n.op} (library operator)"] += 1
    print("ops:", dict(graph.op_counts()))
    for k, v in sorted(reasons.items()):
        print(f"  opaque {v} x {k}")
    with torch.no_grad():
        y = run_graph(graph, list(x))[graph.outputs[0]]
    print(f"RESULT {spec} import {seconds:.1f}s nodes {len(graph.nodes)} opaque "
          f"{sum(reasons.values())} relerr {rel(y, ref):.2e}")


def check_optimize(spec: str, module: torch.nn.Module, x: tuple, ref: torch.Tensor) -> None:
    t = time.time()
    program = ollie.optimize(module, x, config=TINY)
    seconds = time.time() - t
    with torch.no_grad():
        y = program(*x)
    print(program.summary()[-2000:])
    print(f"RESULT {spec} optimize {seconds:.0f}s relerr {rel(y, ref):.2e}")


def check_compile(spec: str, module: torch.nn.Module, x: tuple, ref: torch.Tensor,
                  log: _Log) -> None:
    backend.BACKEND_CONFIG = TINY
    torch._dynamo.reset()
    t = time.time()
    with torch.no_grad():
        compiled = torch.compile(module, backend="ollie")
        y = compiled(*x)
        seconds = time.time() - t
        again = compiled(*x)
    refused = sum("unchanged" in w for w in log.warnings)
    print(f"RESULT {spec} compile {seconds:.0f}s relerr {rel(y, ref):.2e} second call "
          f"{rel(again, ref):.2e} graphs run unchanged {refused}")


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    mode, spec = argv[0], argv[1]
    options = {k: int(v) for k, v in (a.split("=") for a in argv[2:])}
    module, x = build(spec, 1, **options)
    with torch.no_grad():
        ref = module(*x)
    log = _Log()
    for name in ("ollie", "ollie.frontend.torch_import"):
        logging.getLogger(name).addHandler(log)
    logging.getLogger("ollie.frontend.torch_import").setLevel(logging.DEBUG)
    label = f"{spec} {options}"
    steps = {"import": ["import"], "opt": ["opt"], "compile": ["compile"],
             "both": ["opt", "compile"]}[mode]
    for step in steps:
        log.warnings.clear()
        try:
            if step == "import":
                check_import(label, module, x, ref, log)
            elif step == "opt":
                check_optimize(label, module, x, ref)
            else:
                check_compile(label, module, x, ref, log)
        except Exception as e:
            traceback.print_exc()
            print(f"RESULT {label} {step} ERROR {type(e).__name__}: {str(e)[:400]}")
        print("warnings:", log.warnings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
