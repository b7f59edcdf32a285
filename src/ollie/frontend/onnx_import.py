"""``from_onnx(model, input_shapes=None) -> Graph``.

The model (a path, bytes or an ``onnx.ModelProto``) is read, its input shapes fixed (dynamic
dimensions from ``input_shapes``), and its nodes visited in topological order:

* a node whose inputs are all known values is evaluated once (:mod:`ollie.frontend.onnx_fold`)
  and its outputs become constants: weight-producing subgraphs and shape computations
  (``Shape`` of a tensor of known shape, ``Gather``, ``Unsqueeze``, ``Concat``,
  ``ConstantOfShape``, ...) disappear;
* a node with a converter (:mod:`ollie.frontend.onnx_ops`) becomes graph operators;
* anything else becomes an ``Opaque`` node run by onnxruntime (its output shapes are found by
  running it once on zeros, or by ONNX shape inference).

Constants used by graph nodes become initializers. Every emitted node is run on meta tensors at
once, so a model that cannot work (mismatched shapes) fails at import with the node's name.
Errors are :class:`~ollie.errors.OllieError` naming the file and the node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ollie.errors import OllieError, ShapeError, UnsupportedError
from ollie.frontend import onnx_views  # noqa: F401 - registers its CONVERTERS entries
from ollie.frontend.builder import GraphBuilder
from ollie.frontend.onnx_fold import NONDETERMINISTIC, fold_node
from ollie.frontend.onnx_ops import CONVERTERS, Fallback
from ollie.graph.ir import Graph, prefixed
from ollie.graph.opaque import onnx_opaque_attrs, run_onnx_node

log = logging.getLogger(__name__)


def load_onnx(model: Any) -> tuple[Any, str]:
    """``(onnx.ModelProto, source)`` of a path, bytes or ModelProto; ``source`` names the
    model in error messages (the path, ``<bytes>`` or ``<ModelProto NAME>``). An unreadable
    file raises :class:`~ollie.errors.OllieError`."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        source = f"<ModelProto {model.graph.name or 'graph'}>"
        return checked_model(model, source), source
    if isinstance(model, (bytes, bytearray)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise OllieError(f"<bytes>: not a valid ONNX model ({_line(e)})") from None
        return checked_model(proto, "<bytes>"), "<bytes>"
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise OllieError(f"{path}: no such ONNX file")
        try:
            proto = onnx.load(str(path))
        except Exception as e:
            raise OllieError(f"{path}: not a valid ONNX model ({_line(e)})") from None
        if not proto.graph.node and not proto.graph.output:
            raise OllieError(f"{path}: not a valid ONNX model (empty graph)")
        return checked_model(proto, str(path)), str(path)
    raise OllieError(f"from_onnx expects a path, bytes or an onnx.ModelProto, got "
                     f"{type(model).__name__}")


def checked_model(proto: Any, source: str) -> Any:
    """``proto`` after the checks ONNX Runtime would make before running it: the graph has
    outputs; its default-domain opset is one this ``onnx`` package knows (a newer one's
    operators may mean something else); every node passes ONNX's node checker (its operator is
    registered in an imported domain, its attributes are the schema's, each once, of the
    right types; operators of a custom domain are not checked against a schema); every
    initializer's data matches its type and shape. A model that fails raises
    :class:`~ollie.errors.OllieError` (:class:`~ollie.errors.UnsupportedError` for an opset
    too new) naming ``source`` and the node or tensor. Nodes out of topological order and
    missing shape information are accepted (the importer orders nodes and infers shapes)."""
    import onnx
    from onnx import checker

    known = onnx.defs.onnx_opset_version()
    opsets = {imp.domain or "": int(imp.version) for imp in proto.opset_import}
    default = opsets.get("", opsets.get("ai.onnx", 0))
    if default > known:
        raise UnsupportedError(f"{source}: the model uses ONNX opset {default}; this "
                               f"installation knows opsets up to {known} (upgrade onnx)")
    if not proto.graph.output:
        raise OllieError(f"{source}: not a valid ONNX model (the graph has no outputs)")
    ctx = checker.C.CheckerContext()
    ctx.ir_version = int(proto.ir_version) or onnx.IR_VERSION
    ctx.opset_imports = opsets
    for tensor in proto.graph.initializer:
        try:
            checker.check_tensor(tensor, ctx)
        except Exception as e:  # onnx's ValidationError
            raise OllieError(f"{source}: not a valid ONNX model (initializer '{tensor.name}': "
                             f"{_line(e)})") from None
    for node in proto.graph.node:
        if node.domain not in ("", "ai.onnx") and node.domain in opsets:
            continue  # a custom operator: converted by name, or refused by the importer
        try:
            checker.check_node(node, ctx)
        except Exception as e:
            raise OllieError(f"{source}: not a valid ONNX model (node '{node.name}' "
                             f"({node.op_type}): {_line(e)})") from None
    return proto


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _toposort(nodes: Sequence[Any], available: set[str], source: str) -> list[Any]:
    """Nodes in an order where every input is produced before use (stable)."""
    done = set(available)
    pending = list(nodes)
    out: list[Any] = []
    while pending:
        rest = []
        for n in pending:
            if all(not i or i in done for i in n.input):
                out.append(n)
                done.update(o for o in n.output if o)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            n = rest[0]
            missing = next(i for i in n.input if i and i not in done)
            raise OllieError(f"{source}: node '{n.name or n.output[0]}' ({n.op_type}) reads "
                             f"'{missing}', which no node, input or initializer defines "
                             "(or the graph has a cycle)")
        pending = rest
    return out


class OnnxImporter:
    """Converts one ONNX ModelProto (see the module docstring)."""

    def __init__(self, model: Any, source: str,
                 input_shapes: Mapping[str, Sequence[int]] | None) -> None:
        self.model = model
        self.source = source
        self.opsets = [(o.domain if o.domain != "ai.onnx" else "", int(o.version))
                       for o in model.opset_import]
        self.opset = next((v for d, v in self.opsets if d == ""), 13)
        self.b = GraphBuilder(Path(source).stem if source[0] != "<" else
                              (model.graph.name or "onnx"), track_shapes=True)
        self.consts: dict[str, np.ndarray] = {}
        self.names: dict[str, str] = {}
        self._const_names: dict[str, str] = {}
        self._input_shapes = dict(input_shapes or {})
        self._inferred: dict[str, Any] | None = None

    # ------------------------------------------------------------------ values
    def value(self, name: str) -> str:
        """The graph tensor of ONNX tensor ``name`` (constants become initializers)."""
        if name in self.names:
            return self.names[name]
        if name in self.consts:
            if name not in self._const_names:
                self._const_names[name] = self.b.add_const(self.consts[name], name)
            return self._const_names[name]
        raise OllieError(f"{self.source}: tensor '{name}' is not defined")

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(int(d) for d in np.shape(self.consts[name]))
        return self.b.shape(self.value(name))

    def dtype(self, name: str) -> str:
        if name in self.consts:
            return str(np.asarray(self.consts[name]).dtype)
        return self.b.dtype(self.value(name))

    def emit(self, op: str, node: Any, inputs: Sequence[str], attrs: dict[str, Any],
             resolved: bool = False, hint: str | None = None) -> str:
        """Emit one graph node for ONNX ``node``; ``inputs`` are ONNX names (graph names when
        ``resolved``); empty names are dropped."""
        ins = list(inputs) if resolved else [self.value(i) for i in inputs if i]
        label = hint or node.output[0]
        return self.b.emit(op, ins, attrs, hint=label, name=node.name or label)[0]

    # ------------------------------------------------------------------ main
    def run(self) -> Graph:
        from onnx import numpy_helper

        g = self.model.graph
        for init in g.initializer:
            try:
                self.consts[init.name] = numpy_helper.to_array(init)
            except Exception as e:
                raise OllieError(f"{self.source}: cannot read initializer '{init.name}' "
                                 f"({_line(e)})") from None
        for sp in g.sparse_initializer:
            raise UnsupportedError(f"{self.source}: sparse initializer "
                                   f"'{sp.values.name}' is not supported")
        self._inputs(g)
        for node in _toposort(g.node, set(self.consts) | set(self.names), self.source):
            self._node(node)
        for out in g.output:
            if out.name not in self.names and out.name not in self.consts:
                raise OllieError(f"{self.source}: graph output '{out.name}' is not produced")
            self.b.add_output(self.value(out.name), out.name)
        return self.b.finish()

    def _inputs(self, g: Any) -> None:
        from onnx import helper

        known = {i.name for i in g.input}
        for key in self._input_shapes:
            if key not in known:
                raise OllieError(f"{self.source}: input_shapes names '{key}', which is not an "
                                 f"input of the model (inputs: {', '.join(sorted(known))})")
        for vi in g.input:
            if vi.name in self.consts and vi.name not in self._input_shapes:
                continue  # an initializer listed as an input (old exporters)
            self.consts.pop(vi.name, None)
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise UnsupportedError(f"{self.source}: input '{vi.name}' is not a tensor")
            dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
            if vi.name in self._input_shapes:
                shape = tuple(int(d) for d in self._input_shapes[vi.name])
            else:
                if not tt.HasField("shape"):
                    raise OllieError(f"{self.source}: input '{vi.name}' has no shape; pass "
                                     "input_shapes")
                dims = []
                for k, d in enumerate(tt.shape.dim):
                    if d.HasField("dim_value") and d.dim_value > 0:
                        dims.append(int(d.dim_value))
                    else:
                        raise ShapeError(f"{self.source}: input '{vi.name}' has dynamic "
                                         f"dimension {k} ('{d.dim_param or '?'}') of shape "
                                         f"{_dims_text(tt)}: pass example inputs, whose "
                                         "shapes fix it: ollie.optimize(model, (x,)) "
                                         f"(from_onnx: input_shapes={{'{vi.name}': (...)}})")
                shape = tuple(dims)
            if any(d <= 0 for d in shape):
                raise OllieError(f"{self.source}: input '{vi.name}' has shape {list(shape)}")
            self.names[vi.name] = self.b.add_input(vi.name, shape, dtype)

    def _node(self, node: Any) -> None:
        label = f"node '{node.name or node.output[0]}' ({node.op_type})"
        present = [i for i in node.input if i]
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        try:
            if domain == "" and node.op_type in ("Shape", "Size") and present \
                    and present[0] not in self.consts:
                self._shape_node(node)
                return
            if all(i in self.consts for i in present) and \
                    not (domain == "" and node.op_type in NONDETERMINISTIC):
                vals = fold_node(node, self.opsets, [self.consts[i] for i in present])
                if vals is not None:
                    for o, v in zip(node.output, vals, strict=False):
                        if o:
                            self.consts[o] = np.asarray(v)
                    return
            outs = None
            conv = CONVERTERS.get((domain, node.op_type))
            if conv is not None:
                try:
                    outs = conv(self, node, _attrs(node))
                except Fallback as e:
                    log.debug("%s kept opaque: %s", label, e)
            if outs is None:
                outs = self._opaque(node)
        except OllieError as e:
            if self.source in str(e):
                raise
            raise prefixed(e, f"{self.source}: {label}") from e
        except Exception as e:
            raise OllieError(f"{self.source}: {label}: {_line(e)}") from e
        for o, g in zip(node.output, outs, strict=False):
            if o and g is not None:
                self.names[o] = g

    def _shape_node(self, node: Any) -> None:
        shape = self.shape(node.input[0])
        if node.op_type == "Size":
            self.consts[node.output[0]] = np.asarray(int(np.prod(shape)), dtype=np.int64)
            return
        a = _attrs(node)
        start, end = int(a.get("start", 0)), a.get("end")
        sel = shape[start:] if end is None else shape[start:int(end)]
        self.consts[node.output[0]] = np.asarray(sel, dtype=np.int64)

    def _opaque(self, node: Any) -> list[str | None]:
        present = [i for i in node.input if i]
        ins = [self.value(i) for i in present]
        samples = [self.consts[i] if i in self.consts else
                   np.zeros(self.shape(i), dtype=self.dtype(i)) for i in present]
        shapes: list[tuple[int, ...]] | None = None
        dtypes: list[str] = []
        try:
            vals = run_onnx_node(node, self.opsets, samples)
            shapes = [tuple(np.shape(v)) for v in vals]
            dtypes = [str(np.asarray(v).dtype) for v in vals]
        except OllieError as e:
            log.debug("node '%s': onnxruntime on sample inputs failed: %s", node.name, e)
            inferred = self._inferred_types()
            found = [inferred.get(o) for o in node.output]
            if all(f is not None for f in found):
                shapes = [f[0] for f in found]  # type: ignore[index]
                dtypes = [f[1] for f in found]  # type: ignore[index]
            else:
                raise UnsupportedError(f"cannot run or infer the output shapes of this "
                                       f"operator ({e})") from None
        attrs = onnx_opaque_attrs(node, self.opsets, shapes, dtypes)
        hint = node.output[0] or node.op_type
        return list(self.b.emit("Opaque", ins, attrs, hint=hint, n_outputs=len(node.output),
                                name=node.name or hint))

    def _inferred_types(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Static output types from ONNX shape inference (computed once)."""
        if self._inferred is None:
            import onnx
            from onnx import helper

            self._inferred = {}
            try:
                model = onnx.shape_inference.infer_shapes(self.model, data_prop=True)
            except Exception:
                return self._inferred
            for vi in [*model.graph.value_info, *model.graph.output]:
                tt = vi.type.tensor_type
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
                if tt.HasField("shape") and all(d >= 0 for d in dims) and tt.elem_type:
                    dt = str(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
                    self._inferred[vi.name] = (tuple(dims), dt)
        return self._inferred


def _dims(tt: Any) -> list[int | str]:
    """The dimensions of an ONNX tensor type: an int where fixed, the ``dim_param`` (or
    ``'?'``) where symbolic."""
    return [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else
            (d.dim_param or "?") for d in tt.shape.dim]


def _dims_text(tt: Any) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else repr(d) for d in _dims(tt)) + "]"


def graph_inputs(proto: Any) -> list[Any]:
    """The inputs of an ONNX model's graph that are not initializers (``ValueInfoProto``s, in
    order): what a caller feeds."""
    inits = {i.name for i in proto.graph.initializer}
    return [vi for vi in proto.graph.input if vi.name not in inits]


def example_shapes(proto: Any, source: str, example_inputs: Sequence[Any]
                   ) -> dict[str, tuple[int, ...]]:
    """``{input name: shape}`` of the example inputs of the ONNX model ``proto`` (one per
    graph input, in order; anything with a ``shape``): they fix its symbolic dimensions. A
    count, rank or fixed dimension that does not match raises
    :class:`~ollie.errors.ShapeError` naming the input."""
    inputs = graph_inputs(proto)
    names = ", ".join(vi.name for vi in inputs)
    if len(example_inputs) != len(inputs):
        raise ShapeError(f"{source}: the model has {len(inputs)} input(s) ({names}), got "
                         f"{len(example_inputs)} example input(s)")
    shapes = {}
    for k, (vi, x) in enumerate(zip(inputs, example_inputs, strict=True)):
        shape = getattr(x, "shape", None)
        if shape is None:
            raise ShapeError(f"{source}: example input {k} (for '{vi.name}') is a "
                             f"{type(x).__name__}, expected a tensor")
        shape = tuple(int(d) for d in shape)
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            dims = _dims(tt)
            if len(dims) != len(shape) or any(isinstance(d, int) and d != s
                                               for d, s in zip(dims, shape, strict=False)):
                raise ShapeError(f"{source}: example input {k} has shape {list(shape)}, but "
                                 f"the model's input '{vi.name}' is {_dims_text(tt)}")
        shapes[vi.name] = shape
    return shapes


def float32_problem(proto: Any, source: str) -> str | None:
    """Why Ollie cannot optimise ``proto`` as a float32 model (an input of another element
    type), and what to do, or None."""
    from onnx import TensorProto, helper

    for vi in graph_inputs(proto):
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if elem not in (0, TensorProto.FLOAT):
            try:
                name = helper.tensor_dtype_to_np_dtype(elem).name
            except (KeyError, ValueError):
                name = TensorProto.DataType.Name(elem).lower()
            return (f"{source}: Ollie optimizes float32 models (its programs compute in "
                    f"float32); input '{vi.name}' is {name}: export or convert the model in "
                    "float32")
    return None


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], (int, float)):
            v = tuple(v)
        out[a.name] = v
    return out


def from_onnx(model: str | Path | bytes | Any, input_shapes: Mapping[str, Sequence[int]]
              | None = None, *, fold_batchnorm: bool = False, source: str | None = None
              ) -> Graph:
    """Import an ONNX model (path, bytes or ``onnx.ModelProto``) as a :class:`Graph`.

    ``input_shapes``: ``{input name: shape}`` fixing dynamic (or overriding) input shapes
    (:func:`example_shapes` makes one from example inputs).
    ``fold_batchnorm``: fold BatchNorm into preceding convolutions
    (:func:`ollie.graph.passes.fold_batchnorm`).
    ``source``: the model's name in error messages (default: :func:`load_onnx`'s).
    """
    proto, loaded = load_onnx(model)
    graph = OnnxImporter(proto, source or loaded, input_shapes).run()
    if fold_batchnorm:
        from ollie.graph.passes import fold_batchnorm as fold

        graph = fold(graph)
    return graph
