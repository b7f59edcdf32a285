"""Print what the torch frontend makes of a model: operator counts, every opaque node with the
reason it stayed opaque, and the connected regions of lowerable nodes between opaque ones.

    python tools/graph_ops.py MODEL [--batch B] [--opt KEY=VALUE ...]

MODEL is ``zoo:NAME`` (or a bare zoo name; ``--opt`` sets its options, e.g. ``--opt seq=32``),
``vit_block`` (a ViT encoder block written with ``nn.MultiheadAttention``, from
tests/frontend/vit_block.py; options ``seq``, ``dim``, ``heads``, ``mlp``) or
``torchvision:NAME`` (e.g. ``torchvision:vit_b_16``, where torchvision is installed).

A region is a set of non-opaque nodes connected through the tensors they pass each other;
the optimizer cannot see across an opaque node, so a region with one compute operator is all
it ever gets to derive.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent


class _Reasons(logging.Handler):
    """Collects the importer's 'kept opaque' debug messages by fx node name."""

    PATTERN = re.compile(r"fx node '([^']+)' \((.*?)\) kept opaque: (.*)")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.by_node: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.match(record.getMessage())
        if m:
            self.by_node[m.group(1)] = m.group(3)


def _options(pairs: list[str]) -> dict[str, int]:
    out = {}
    for p in pairs:
        key, _, value = p.partition("=")
        out[key] = int(value)
    return out


def build(model: str, batch: int, options: dict[str, int]) -> tuple[torch.nn.Module, tuple]:
    """(module in eval mode, example inputs) of ``model``."""
    if model == "vit_block":
        sys.path.insert(0, str(ROOT / "tests" / "frontend"))
        from vit_block import ViTBlock  # type: ignore[import-not-found]

        seq = options.pop("seq", 197)
        torch.manual_seed(0)
        module = ViTBlock(**options).eval()
        dim = module.ln_1.normalized_shape[0]
        return module, (torch.randn(batch, seq, dim),)
    if model.startswith("torchvision:"):
        import torchvision  # type: ignore[import-not-found]

        module = getattr(torchvision.models, model.split(":", 1)[1])(**options).eval()
        return module, (torch.randn(batch, 3, 224, 224),)
    import ollie.zoo

    return ollie.zoo.get(model, batch, **options)


def regions(graph: Any) -> list[list[Any]]:
    """Connected components of the non-opaque nodes (edges: a tensor one writes and the other
    reads), in graph order."""
    lowerable = [n for n in graph.nodes if not n.opaque]
    parent = {id(n): id(n) for n in lowerable}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    producer = {o: n for n in lowerable for o in n.outputs}
    for n in lowerable:
        for i in n.inputs:
            p = producer.get(i)
            if p is not None:
                parent[find(id(n))] = find(id(p))
    groups: dict[int, list[Any]] = {}
    for n in lowerable:
        groups.setdefault(find(id(n)), []).append(n)
    return list(groups.values())


def report(model: str, batch: int, options: dict[str, int]) -> str:
    from ollie.frontend import from_torch
    from ollie.frontend.torch_ops import HANDLERS
    from ollie.graph.ir import COMPUTE_OPS, OPAQUE

    module, inputs = build(model, batch, dict(options))
    catcher = _Reasons()
    log = logging.getLogger("ollie.frontend.torch_import")
    old = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(catcher)
    try:
        graph = from_torch(module, inputs)
    finally:
        log.removeHandler(catcher)
        log.setLevel(old)
    lines = [f"{model} (batch {batch}{''.join(f', {k}={v}' for k, v in options.items())}): "
             f"{len(graph.nodes)} nodes"]
    lines.append("ops: " + ", ".join(f"{k} x{v}" for k, v in graph.op_counts().items()))
    reasons: Counter[str] = Counter()
    for n in graph.nodes:
        if n.op == OPAQUE:
            target = str(n.attrs.get("target", n.attrs.get("op_type", "?")))
            why = catcher.by_node.get(n.name) or (
                "converter fell back" if target in HANDLERS else "no converter")
            reasons[f"Opaque[{n.attrs.get('op_type', '?')}] ({target}): {why}"] += 1
        elif n.opaque:
            reasons[f"{n.op}: opaque operator kind (library operator, no expression)"] += 1
    lines.append(f"opaque nodes: {sum(reasons.values())}")
    lines += [f"  {v} x {k}" for k, v in sorted(reasons.items())]
    regs = regions(graph)
    with_compute = [sum(n.op in COMPUTE_OPS for n in r) for r in regs]
    lines.append(f"regions of lowerable nodes: {len(regs)}; compute ops per region: "
                 f"{sorted((c for c in with_compute if c), reverse=True)}; "
                 f"sizes: {sorted((len(r) for r in regs), reverse=True)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    print(report(args.model, args.batch, _options(args.opt)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
