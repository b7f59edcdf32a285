"""Graphs of the torch.compile backend that take integer or boolean tensors whose values change
between calls (token ids, attention masks): :func:`split_at_floats` cuts off the nodes that turn
them into floating-point tensors (embedding lookups, mask casts and indexing), which then run
in PyTorch as the graph runs them, and leaves the rest, a graph of those floating-point
tensors, for Ollie to optimise: its program then serves every call, whatever the ids.

A node belongs to the cut-off part when every node it reads is such an integer input, a
parameter or buffer, a number, a constant (a node computed from those alone: an ``arange``),
or a node of the part, and it reads an integer input or a non-floating node of the part; so
the part ends at the first floating-point tensors computed from the integers (an embedding's
output, not the sum of embeddings and the layer norm after it). The part computes the
constants it reads itself; the rest keeps its own. The part's nodes the rest reads are the
rest's new inputs, after the graph's inputs the rest still reads; a boolean one (DeBERTa's
mask, read by the ``masked_fill`` of the scores) crosses as a float tensor of 0 and 1 and is
cast back in the rest. Where there is no such
input, nothing to cut off, or the rest would read a part node that is not a tensor: None,
and the backend keeps the integers as constants of the program (a call with other values
runs the graph). Why, and the figures: docs/design/042-integer-inputs-in-the-backend.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import fx


def static_input(x: object) -> bool:
    """Whether dynamo marked graph input ``x`` as a module's parameter or buffer."""
    return isinstance(x, torch.Tensor) and \
        getattr(x, "_dynamo_static_input_type", None) is not None


def varying_integers(inputs: Sequence[object]) -> list[int]:
    """Positions of the integer and boolean tensor inputs that are not a module's parameters
    or buffers (dynamo marks those static)."""
    return [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
            and not x.is_floating_point() and not static_input(x)]


def _value(node: fx.Node) -> object:
    return node.meta.get("example_value", node.meta.get("val"))


def _computes(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method")


def part_nodes(gm: fx.GraphModule, inputs: Sequence[object]) -> set[fx.Node]:
    """The nodes of the cut-off part (see the module docstring), without the constants it
    reads and without placeholders."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        return set()
    varying = {placeholders[i] for i in varying_integers(inputs)}
    known = {p for p, x in zip(placeholders, inputs, strict=True)
             if not isinstance(x, torch.Tensor) or static_input(x)}  # constants and their nodes
    known |= {n for n in gm.graph.nodes if n.op == "get_attr"}
    integral = set(varying)  # nodes of non-floating values computed from the integers
    part: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if not _computes(node):
            continue
        reads = node.all_input_nodes
        if all(r in known for r in reads):
            known.add(node)
            continue
        if not all(r in varying or r in known or r in part for r in reads) or \
                not any(r in integral for r in reads):
            continue
        part.add(node)
        value = _value(node)
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            integral.add(node)
    return part


@dataclass
class Split:
    """A graph cut in two (:func:`split_at_floats`): ``part`` (a graph module of the graph's
    inputs, returning the tuple of the tensors the rest reads) and ``rest`` (a graph module of
    the graph's inputs at ``kept`` followed by those tensors, returning what the graph
    returns)."""

    part: fx.GraphModule
    rest: fx.GraphModule
    kept: tuple[int, ...]

    def rest_inputs(self, inputs: Sequence[object]) -> tuple[object, ...]:
        """The rest's inputs for the graph's ``inputs`` (the part runs, without gradients)."""
        with torch.no_grad():
            made = self.part(*inputs)
        return (*(inputs[i] for i in self.kept), *made)

    def joined(self, rest: Callable[..., object]) -> Callable[..., object]:
        """The graph as a function: the part, then ``rest`` (the rest or its program)."""
        part, kept = self.part, self.kept

        def run(*args: object) -> object:
            return rest(*(args[i] for i in kept), *part(*args))

        return run


def split_at_floats(gm: fx.GraphModule, inputs: Sequence[object]) -> Split | None:
    """``gm`` cut into the part that turns its varying integer inputs into floating-point
    tensors and the rest (see the module docstring), or None."""
    if not varying_integers(inputs):
        return None
    part = part_nodes(gm, inputs)
    if not part:
        return None
    outputs = [n for n in gm.graph.nodes if n in part and any(u not in part for u in n.users)]
    if not outputs or not all(isinstance(_value(n), torch.Tensor) for n in outputs):
        return None
    needed: set[fx.Node] = set()  # the part and every node it reads, transitively
    stack = list(part)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    first = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in needed:
            env[node] = first.node_copy(node, env.__getitem__)
    # a boolean the rest reads (a mask meeting the scores in one masked_fill) crosses as 0.0
    # / 1.0, cast back in the rest: a floating-point input of the program, exactly
    boolean = {n for n in outputs if getattr(_value(n), "dtype", None) == torch.bool}
    first.output(tuple(first.call_method("float", (env[n],)) if n in boolean else env[n]
                       for n in outputs))
    second = fx.Graph()
    env = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        env[node] = second.node_copy(node, env.__getitem__)
    for k, node in enumerate(outputs):
        env[node] = second.placeholder(f"ollie_cut_{k}")
    for node in boolean:
        env[node] = second.call_method("bool", (env[node],))
    for node in gm.graph.nodes:
        if node.op != "placeholder" and node not in part:
            env[node] = second.node_copy(node, env.__getitem__)
    second.eliminate_dead_code()
    kept = tuple(i for i, p in enumerate(placeholders) if env[p].users)
    for i, p in enumerate(placeholders):
        if i not in kept:
            second.erase_node(env[p])
    return Split(fx.GraphModule(gm, first), fx.GraphModule(gm, second), kept)


__all__ = ["Split", "part_nodes", "split_at_floats", "static_input", "varying_integers"]
