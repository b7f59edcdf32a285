"""Graph-to-graph passes (each returns a new :class:`Graph`; the input is not modified).

* :func:`fold_batchnorm`: ``BatchNorm(Conv2d(x, W, b))`` -> ``Conv2d(x, W', b')`` with
  ``W'[f] = W[f] * s[f]``, ``b' = (b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)``
  (computed in float64), when the convolution's output feeds only the BatchNorm and all
  parameters are initializers (also ``ConvTranspose2d`` with ``groups == 1``).
* :func:`eliminate_identity`: removes ``Identity`` nodes (readers use the input directly)
  except where the identity defines a graph output from a graph input / initializer.
"""

from __future__ import annotations

import numpy as np

from ollie.graph.ir import Graph, Node, sanitize


def _copy(graph: Graph, nodes: list[Node], inits: dict[str, np.ndarray]) -> Graph:
    g = Graph(list(graph.inputs), list(graph.outputs), nodes, inits, graph.name,
              dict(graph.original_names), dtypes={n: graph.dtypes.get(n, "float32")
                                                  for n, _ in graph.inputs})
    return g.infer_shapes()


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold inference BatchNorm into the preceding convolution (see the module docstring)."""
    producers = graph.producers()
    consumers = graph.consumers()
    inits = dict(graph.initializers)
    taken = set(inits) | {o for n in graph.nodes for o in n.outputs} | set(graph.input_names)
    folded: dict[int, Node] = {}  # id(conv) -> replacement conv
    dropped: set[int] = set()
    for bn in graph.nodes:
        if bn.op != "BatchNorm" or len(bn.inputs) != 5:
            continue
        x = bn.inputs[0]
        conv = producers.get(x)
        if conv is None or conv.op not in ("Conv2d", "ConvTranspose2d") or x in graph.outputs:
            continue
        if len(consumers.get(x, [])) != 1 or id(conv) in folded:
            continue
        params = [*conv.inputs[1:], *bn.inputs[1:]]
        if any(p not in graph.initializers for p in params):
            continue
        transposed = conv.op == "ConvTranspose2d"
        if transposed and int(conv.attrs.get("groups", 1)) != 1:
            continue
        gamma, beta, mean, var = (np.asarray(graph.initializers[p], dtype=np.float64)
                                  for p in bn.inputs[1:])
        scale = gamma / np.sqrt(var + float(bn.attrs.get("eps", 1e-5)))
        w = np.asarray(graph.initializers[conv.inputs[1]], dtype=np.float64)
        shape = (1, -1, 1, 1) if transposed else (-1, 1, 1, 1)
        w2 = (w * scale.reshape(shape)).astype(np.float32)
        b = np.asarray(graph.initializers[conv.inputs[2]], dtype=np.float64) \
            if len(conv.inputs) > 2 else np.zeros_like(mean)
        b2 = ((b - mean) * scale + beta).astype(np.float32)
        w_name = sanitize(f"{conv.inputs[1]}_bn", taken)
        b_name = sanitize(f"{bn.name}_bias", taken)
        inits[w_name], inits[b_name] = w2, b2
        folded[id(conv)] = Node(conv.op, (conv.inputs[0], w_name, b_name), bn.outputs,
                                dict(conv.attrs), conv.name)
        dropped.add(id(bn))
    nodes = [folded.get(id(n), n) for n in graph.nodes if id(n) not in dropped]
    used = {i for n in nodes for i in n.inputs} | set(graph.outputs)
    inits = {k: v for k, v in inits.items() if k in used}
    return _copy(graph, nodes, inits)


def eliminate_identity(graph: Graph) -> Graph:
    """Remove Identity nodes (see the module docstring)."""
    alias: dict[str, str] = {}
    nodes: list[Node] = []
    keep_defs = set(graph.input_names) | set(graph.initializers)
    for n in graph.nodes:
        ins = tuple(alias.get(i, i) for i in n.inputs)
        if n.op == "Identity" and not (n.outputs[0] in graph.outputs and ins[0] in keep_defs):
            if n.outputs[0] in graph.outputs:
                # the output keeps its name: rename the producer's output instead
                src = ins[0]
                for k, m in enumerate(nodes):
                    if src in m.outputs and src not in graph.outputs:
                        outs = tuple(n.outputs[0] if o == src else o for o in m.outputs)
                        nodes[k] = Node(m.op, m.inputs, outs, dict(m.attrs), m.name)
                        alias[src] = n.outputs[0]
                        break
                else:
                    nodes.append(Node(n.op, ins, n.outputs, dict(n.attrs), n.name))
                continue
            alias[n.outputs[0]] = ins[0]
            continue
        nodes.append(Node(n.op, ins, n.outputs, dict(n.attrs), n.name))
    # readers of a renamed producer output that appear before were already rewritten above
    fixed = [Node(m.op, tuple(alias.get(i, i) for i in m.inputs), m.outputs, m.attrs, m.name)
             for m in nodes]
    return _copy(graph, fixed, dict(graph.initializers))
