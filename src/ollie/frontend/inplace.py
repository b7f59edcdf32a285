"""In-place operators of an exported graph replaced by their functional forms where nothing
else can see the write: :func:`rewrite_in_place`.

``ReLU(inplace=True)`` and ``out += identity`` (ResNet, MobileNet, EfficientNet) export as
``aten.relu_`` / ``aten.add_`` on a tensor that an operator just made and that no view
aliases. Writing it in place or making a new tensor then differs only for the readers after
the write, which this pass points at the new tensor. torch's general functionalisation
(``ExportedProgram.run_decompositions``, :func:`ollie.frontend.torch_import.from_torch`'s
fallback) handles every case, writes through views included, but retraces the whole
program; for these graphs this pass gives the same dataflow without a retrace. The graph is
changed only when every in-place call in it qualifies; otherwise it is left as it was and the
caller functionalises it the general way. Why: docs/design/031-warm-optimisation.md.
"""

from __future__ import annotations

import torch
from torch import fx


def _schema(node: fx.Node) -> torch.FunctionSchema | None:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return node.target._schema


def _aliases(schema: torch.FunctionSchema) -> bool:
    """Whether an operator of ``schema`` writes an argument or returns an alias of one."""
    return schema.is_mutable or any(r.alias_info is not None for r in schema.returns) or \
        any(a.alias_info is not None for a in schema.arguments)


def _functional(node: fx.Node) -> torch._ops.OpOverload | None:
    """The functional overload computing what in-place ``node`` writes (``aten.relu_.default``
    -> ``aten.relu.default``), when ``node`` writes its first argument only, returns it, and
    the functional one takes arguments of the same types; else None."""
    schema = _schema(node)
    if schema is None or not schema.is_mutable or not schema.name.endswith("_"):
        return None
    written = [i for i, a in enumerate(schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    if written != [0] or len(schema.returns) != 1 or schema.returns[0].alias_info is None:
        return None
    target = node.target
    assert isinstance(target, torch._ops.OpOverload)
    namespace, _, name = schema.name.partition("::")
    packet = getattr(getattr(torch.ops, namespace, None), name[:-1], None)
    overload = getattr(packet, target._overloadname, None) if packet is not None else None
    if not isinstance(overload, torch._ops.OpOverload) or _aliases(overload._schema) or \
            [str(a.type) for a in overload._schema.arguments] != \
            [str(a.type) for a in schema.arguments]:
        return None
    return overload


def _plan(gm: fx.GraphModule) -> dict[fx.Node, torch._ops.OpOverload] | None:
    """Each in-place call of ``gm`` with its functional overload, when every one qualifies:
    it writes a tensor (its first argument) that an operator of the graph made without
    aliasing anything (or an earlier qualifying in-place call returned), and that (like the
    call's result, the same tensor) only operators which alias nothing, other qualifying
    in-place calls and the graph's output read. None when some in-place call does not."""
    plan: dict[fx.Node, torch._ops.OpOverload] = {}
    mutating = [n for n in gm.graph.nodes if (s := _schema(n)) is not None and s.is_mutable]
    for node in mutating:
        functional = _functional(node)
        written = node.args[0] if node.args else None
        if functional is None or not isinstance(written, fx.Node):
            return None
        made = _schema(written)
        if written not in plan and (made is None or _aliases(made)):
            return None  # an input, a constant, a view or an unknown producer
        # the call's result is the written tensor itself: neither may be read by an operator
        # that aliases it (a view would see later writes that the rewrite no longer makes)
        for user in (*written.users, *node.users):
            schema = _schema(user)
            if user.op != "output" and user not in mutating and \
                    (schema is None or _aliases(schema)):
                return None
        plan[node] = functional
    return plan


def rewrite_in_place(gm: fx.GraphModule) -> bool:
    """Replace every in-place call of ``gm`` by its functional overload, the readers of the
    written tensor after the call reading the call's result instead, when every one qualifies
    (:func:`_plan`); True when ``gm`` has none left (changed in place), False when it was
    left unchanged."""
    plan = _plan(gm)
    if plan is None:
        return False
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node, functional in plan.items():
        written = node.args[0]
        assert isinstance(written, fx.Node)
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(functional, node.args, dict(node.kwargs))
        new.meta = dict(node.meta)
        order[new] = order[node]
        for user in list(written.users):
            if user is not new and user is not node and order.get(user, -1) > order[node]:
                user.replace_input_with(written, new)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return True


__all__ = ["rewrite_in_place"]
