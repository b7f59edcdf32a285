"""``from_torch(module, example_inputs) -> Graph`` through ``torch.export``.

The module is exported (``torch.export.export``; ``make_fx`` as the fallback when export
fails), then each ``aten`` node is converted by the handlers of
:mod:`ollie.frontend.torch_ops` into graph operators. Parameters, buffers and lifted constants
become initializers (named after their state-dict key); nodes whose inputs are all constants
are evaluated once and become initializers too (compile-time weight transforms), as do
factories that read only a computed tensor's shape and dtype (``new_zeros``, ``full_like``,
...: :data:`_SHAPE_ONLY`). Unknown
operators become ``Opaque`` nodes that call the ``aten`` op. Every converted tensor's shape is
checked against the shape ``torch.export`` recorded. The checks of a module before and
after its import (:func:`float32_problem`, :func:`check_import`) are in
:mod:`ollie.frontend.torch_check`.
"""

from __future__ import annotations

import logging
import operator
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import fx

import ollie.zoo.ops  # noqa: F401 - registers torch.ops.ollie.*
from ollie.errors import OllieError, ShapeError, UnsupportedError
from ollie.frontend import torch_views  # noqa: F401 - registers its HANDLERS entries
from ollie.frontend.builder import GraphBuilder
from ollie.frontend.inplace import rewrite_in_place
from ollie.frontend.torch_ops import HANDLERS, Fallback, bind, meta_val, shape
from ollie.graph.ir import Graph, prefixed
from ollie.graph.opaque import TensorRef, dtype_name, torch_opaque_attrs

log = logging.getLogger(__name__)

CONSTANT_OUTPUTS = (type(None), bool, int, float, str)
"""Values a module may return beside its tensors (the imported graph's outputs are the
tensors; :mod:`ollie.optimizer.structure` returns these with them)."""


def _as_tuple(example_inputs: Any) -> tuple[Any, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    return tuple(example_inputs)


Consts = dict[str, tuple[torch.Tensor, str]]


def _export(module: torch.nn.Module, args: tuple[Any, ...]
            ) -> tuple[fx.GraphModule, Consts, list[str]]:
    """(graph module, placeholder name -> (constant tensor, state-dict key), user input
    placeholder names)."""
    try:
        ep = torch.export.export(module, args)
    except Exception as e:  # fall back to make_fx (aten graph with get_attr constants)
        log.info("torch.export failed (%s); falling back to make_fx", e)
        try:
            from torch.fx.experimental.proxy_tensor import make_fx

            gm = make_fx(module, tracing_mode="real")(*args)
        except Exception as e2:
            raise UnsupportedError(f"cannot trace module {type(module).__name__}: "
                                   f"torch.export failed ({_line(e)}) and make_fx failed "
                                   f"({_line(e2)}); torch.compile(model, backend=\"ollie\") "
                                   "optimises the graphs between the Python it cannot "
                                   "trace") from e2
        users = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        return gm, {}, users
    if _mutates(ep.graph_module) and not rewrite_in_place(ep.graph_module):
        ep = _functional(ep, type(module).__name__)
    consts: Consts = {}
    users: list[str] = []
    kinds = torch.export.graph_signature.InputKind
    state = ep.state_dict
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if spec.kind == kinds.USER_INPUT:
            users.append(name)
        elif spec.kind in (kinds.PARAMETER, kinds.BUFFER, kinds.CONSTANT_TENSOR):
            t = state.get(spec.target)
            if t is None:
                t = ep.constants.get(spec.target)
            if not isinstance(t, torch.Tensor):
                raise UnsupportedError(f"module {type(module).__name__}: input '{name}' "
                                       f"({spec.kind.name} {spec.target}) is not a tensor")
            consts[name] = (t, str(spec.target))
        else:
            raise UnsupportedError(f"module {type(module).__name__}: unsupported exported "
                                   f"input kind {spec.kind.name} ('{name}')")
    return ep.graph_module, consts, users


def _mutates(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` calls an operator that writes one of its arguments (``add_``,
    ``relu_``, ``dropout_``, ...)."""
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _functional(ep: torch.export.ExportedProgram, name: str) -> torch.export.ExportedProgram:
    """``ep`` without in-place operators: torch's functionalisation
    (``run_decompositions({})``, which decomposes nothing else) replaces each write into a
    tensor, and into every view aliasing it, by a new tensor, which the graph's dataflow then
    models. A module that writes into one of its inputs or buffers (a side effect an optimised
    program does not reproduce) raises :class:`UnsupportedError`. The deprecation warning
    torch's own copy of the program's tree specs raises inside ``run_decompositions`` (about
    ``LeafSpec``; nothing the caller can act on) is not shown."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec",
                                    category=FutureWarning)
            ep = ep.run_decompositions({})
    except Exception as e:
        raise UnsupportedError(f"module {name}: in-place operators could not be made "
                               f"functional ({_line(e)})") from e
    kinds = torch.export.graph_signature.OutputKind
    written = [str(s.target) for s in ep.graph_signature.output_specs
               if s.kind != kinds.USER_OUTPUT]
    if written:
        raise UnsupportedError(f"module {name} writes into its input(s) or buffer(s) "
                               f"{', '.join(written)} in place; Ollie optimises modules "
                               "without side effects")
    return ep


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _meta(node: fx.Node) -> Any:
    val = node.meta.get("val")
    if val is None:
        tm = node.meta.get("tensor_meta")
        return tm
    return val


def _shape_of(val: Any) -> tuple[int, ...] | None:
    shape = getattr(val, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None


class TorchImporter:
    """Converts one exported graph module to a :class:`Graph`."""

    def __init__(self, gm: fx.GraphModule, consts: Consts, users: Sequence[str],
                 args: tuple[Any, ...], name: str) -> None:
        self.gm = gm
        self.b = GraphBuilder(name)
        self.values: dict[str, Any] = {}  # fx node name -> graph tensor name(s) or constant
        self.const_tensors: dict[str, torch.Tensor] = {}  # graph initializer -> tensor
        self.expected: dict[str, tuple[int, ...]] = {}
        self._consts = consts
        self._users = list(users)
        self._args = args

    # ------------------------------------------------------------------ helpers
    def const(self, t: torch.Tensor, hint: str) -> str:
        """An initializer holding (a copy of) tensor ``t``."""
        arr = t.detach().cpu().contiguous().numpy().copy()
        name = self.b.add_const(arr, hint)
        self.const_tensors[name] = t.detach()
        return name

    def scalar(self, v: float) -> str:
        """A rank-0 float32 initializer."""
        return self.b.add_const(np.asarray(v, dtype=np.float32), "scalar")

    def tensor(self, arg: Any) -> str:
        """Graph tensor name of an fx argument (python numbers become scalar constants)."""
        if isinstance(arg, fx.Node):
            v = self.values.get(arg.name)
            if not isinstance(v, str):
                raise Fallback(f"argument '{arg.name}' is not a single tensor")
            return v
        if isinstance(arg, (bool, int, float)):
            return self.scalar(float(arg))
        raise Fallback(f"unsupported argument {arg!r}")

    def float_tensor(self, arg: Any) -> str:
        """:meth:`tensor` of ``arg`` as float32 where it holds integers or booleans, as
        PyTorch promotes an element-wise operator's operand (a mask ``y * (y > 0)``): a
        constant is converted here, a computed tensor by an opaque ``_to_copy``. Ollie's
        element-wise kernels compute in float32 and read float32 only."""
        name = self.tensor(arg)
        dtype = getattr(meta_val(arg), "dtype", None) if isinstance(arg, fx.Node) else None
        if dtype is None or dtype.is_floating_point or dtype.is_complex:
            return name
        value = self.const_value(name)
        if value is not None:
            return self.const(value.to(torch.float32), f"{arg.name}_float")
        s = shape(arg)
        attrs = torch_opaque_attrs(torch.ops.aten._to_copy.default, (TensorRef(0),),
                                   {"dtype": torch.float32}, [s], ["float32"])
        return self.b.emit1("Opaque", [name], attrs, hint=f"{arg.name}_float")

    def is_const(self, name: str) -> bool:
        return name in self.b.initializers

    def const_value(self, name: str) -> torch.Tensor | None:
        if name in self.const_tensors:
            return self.const_tensors[name]
        if name in self.b.initializers:
            return torch.from_numpy(np.array(self.b.initializers[name]))
        return None

    # ------------------------------------------------------------------ main loop
    def run(self) -> Graph:
        out_node = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "get_attr":
                t = _get_attr(self.gm, node.target)
                self.values[node.name] = self.const(t, str(node.target)) \
                    if isinstance(t, torch.Tensor) else t
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                out_node = node
            else:
                raise UnsupportedError(f"fx node '{node.name}': unsupported kind '{node.op}'")
        if out_node is None:
            raise UnsupportedError("exported graph has no output")
        outs = out_node.args[0]
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        # None, numbers and text beside the tensors are constants the caller puts back
        # (ollie.optimizer.structure); the graph's outputs are the tensors
        tensors = [(k, o) for k, o in enumerate(outs) if not isinstance(o, CONSTANT_OUTPUTS)]
        if not tensors:
            raise UnsupportedError("the module returns no tensor")
        for k, o in tensors:
            if not isinstance(o, fx.Node) or not isinstance(self.values.get(o.name), str):
                raise UnsupportedError(f"output {k} of the module is not a tensor")
            self.b.add_output(self.values[o.name], f"output_{k}" if len(outs) > 1 else "output")
        graph = self.b.finish()
        self._check_shapes(graph)
        return graph

    def _placeholder(self, node: fx.Node) -> None:
        if node.name in self._consts:
            tensor, target = self._consts[node.name]
            self.values[node.name] = self.const(tensor, target)
            return
        if node.name not in self._users:
            raise UnsupportedError(f"unexpected placeholder '{node.name}'")
        k = self._users.index(node.name)
        example = self._args[k] if k < len(self._args) else None
        if not isinstance(example, torch.Tensor):
            raise UnsupportedError(f"module input {k} ('{node.name}') is not a tensor")
        self.values[node.name] = self.b.add_input(node.name, example.shape,
                                                  dtype_name(example.dtype))

    def _call(self, node: fx.Node) -> None:
        target = node.target
        if target is operator.getitem:
            src, idx = node.args
            v = self.values.get(src.name) if isinstance(src, fx.Node) else None
            if isinstance(v, (list, tuple)) and isinstance(v[idx], str):
                self.values[node.name] = v[idx]
                return
            raise UnsupportedError(f"fx node '{node.name}': getitem {idx} of '{src}' is not "
                                   "available")
        if _qualname(target) in _METADATA_CHECKS:
            # a check of a tensor's dtype / device / layout, fixed when traced: no value
            self.values[node.name] = None
            return
        if self._all_const(node):
            self._fold(node)
            return
        if _qualname(target) in _SHAPE_ONLY and self._fold_shape_only(node):
            return
        handler = HANDLERS.get(_qualname(target))
        result = None
        if handler is not None:
            try:
                result = handler(self, node, bind(target, node.args, node.kwargs))
            except Fallback as e:
                log.debug("fx node '%s' (%s) kept opaque: %s", node.name, target, e)
                result = None
        if result is None:
            result = self._opaque(node)
        self.values[node.name] = result
        val = _meta(node)
        if isinstance(result, str) and _shape_of(val) is not None:
            self.expected.setdefault(result, _shape_of(val))  # type: ignore[arg-type]

    def _all_const(self, node: fx.Node) -> bool:
        """True when ``node`` depends on constants only (and is deterministic)."""
        name = _qualname(node.target)
        if any(word in name for word in _RANDOM):
            return False
        return all(self._constant(d) for d in node.all_input_nodes)

    def _constant(self, d: fx.Node) -> bool:
        """Whether fx node ``d`` is a constant tensor or a python value (a folded size)."""
        v = self.values.get(d.name)
        return (isinstance(v, str) and self.is_const(v)) or \
            (v is not None and not isinstance(v, (str, list, tuple)))

    def _fold_shape_only(self, node: fx.Node) -> bool:
        """Fold a :data:`_SHAPE_ONLY` factory (``x.new_zeros(...)``, ``torch.full_like(x,
        v)``) reading a computed tensor: its value depends on that tensor's shape and dtype
        only (Swin's attention masks are built from one). False where the shape is not
        static or another argument is not a constant."""
        src = node.args[0] if node.args else None
        val = _meta(src) if isinstance(src, fx.Node) else None
        size = _shape_of(val)
        if not isinstance(src, fx.Node) or size is None or \
                not isinstance(getattr(val, "dtype", None), torch.dtype) or \
                any(not self._constant(d) for d in node.all_input_nodes if d is not src):
            return False
        self._fold(node, {src.name: torch.zeros(size, dtype=val.dtype)})
        return True

    def _fold(self, node: fx.Node, stand_ins: dict[str, torch.Tensor] | None = None) -> None:
        def sub(a: Any) -> Any:
            if isinstance(a, fx.Node):
                if stand_ins and a.name in stand_ins:
                    return stand_ins[a.name]
                v = self.values[a.name]
                return self.const_value(v) if isinstance(v, str) else v
            return a

        args = fx.node.map_aggregate(node.args, sub)
        kwargs = fx.node.map_aggregate(node.kwargs, sub)
        with torch.no_grad():
            out = node.target(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            self.values[node.name] = self.const(out, node.name)
        elif isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
            self.values[node.name] = [self.const(o, f"{node.name}_{k}")
                                      for k, o in enumerate(out)]
        else:
            self.values[node.name] = out

    def _opaque(self, node: fx.Node) -> str | list[str]:
        inputs: list[str] = []

        def sub(a: Any) -> Any:
            if isinstance(a, fx.Node):
                v = self.values.get(a.name)
                if v is not None and not isinstance(v, (str, list, tuple)):
                    return v  # a python value
                inputs.append(self.tensor(a))
                return TensorRef(len(inputs) - 1)
            return a

        try:
            args = fx.node.map_aggregate(node.args, sub)
            kwargs = fx.node.map_aggregate(node.kwargs, sub)
        except Fallback as e:
            raise UnsupportedError(f"fx node '{node.name}' ({node.target}): {e}") from None
        val = _meta(node)
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        shapes, dtypes = [], []
        for v in vals:
            s = _shape_of(v)
            if s is None or not hasattr(v, "dtype"):
                raise UnsupportedError(f"fx node '{node.name}' ({node.target}): output shape "
                                       "unknown")
            shapes.append(s)
            dtypes.append(dtype_name(v.dtype))
        attrs = torch_opaque_attrs(node.target, args, kwargs, shapes, dtypes)
        outs = self.b.emit("Opaque", inputs, attrs, hint=node.name, n_outputs=len(vals))
        if isinstance(val, (tuple, list)):
            for o, s in zip(outs, shapes, strict=True):
                self.expected[o] = s
            return outs
        return outs[0]

    def _check_shapes(self, graph: Graph) -> None:
        for name, want in self.expected.items():
            got = graph.shapes.get(name)
            if got is not None and tuple(got) != tuple(want):
                raise ShapeError(f"from_torch: tensor '{name}' has shape {list(got)} in the graph "
                                 f"but {list(want)} in the exported program (conversion bug)")


_METADATA_CHECKS = frozenset({"aten::_assert_tensor_metadata.default"})
"""Operators that check a tensor's metadata (dtype, device, layout: fixed in an exported
graph) and return nothing; they are dropped."""
_SHAPE_ONLY = frozenset({"aten::new_zeros.default", "aten::new_ones.default",
                         "aten::new_full.default", "aten::zeros_like.default",
                         "aten::ones_like.default", "aten::full_like.default"})
"""Factories whose value depends on their first argument's shape and dtype only
(:meth:`TorchImporter._fold_shape_only`)."""

_RANDOM = ("rand", "normal", "bernoulli", "uniform", "multinomial", "dropout", "empty")


def _qualname(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        overload = schema.overload_name
        return f"{schema.name}.{overload}" if overload else f"{schema.name}.default"
    return getattr(target, "__name__", repr(target))


def _get_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def from_torch(module: torch.nn.Module, example_inputs: Any, *, name: str | None = None,
               fold_batchnorm: bool = False) -> Graph:
    """Import a PyTorch module as a :class:`Graph` (see the module docstring).

    ``example_inputs``: a tensor or a tuple of tensors (they fix every shape; their values
    and any aliasing among them do not matter).
    ``fold_batchnorm``: fold inference BatchNorm into the preceding convolutions
    (:func:`ollie.graph.passes.fold_batchnorm`).
    """
    if not isinstance(module, torch.nn.Module):
        raise UnsupportedError(f"from_torch expects a torch.nn.Module, got "
                               f"{type(module).__name__}")
    # torch.export specializes the graph on aliasing among its inputs: given one tensor
    # twice, ``f(a, b)`` is traced as ``f(b, b)``. Distinct copies trace the function itself.
    args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a
                 for a in _as_tuple(example_inputs))
    gname = name or type(module).__name__
    gm, consts, users = _export(module, args)
    try:
        graph = TorchImporter(gm, consts, users, args, gname).run()
    except OllieError as e:
        raise prefixed(e, f"from_torch({gname})") from e
    if fold_batchnorm:
        from ollie.graph.passes import fold_batchnorm as fold

        graph = fold(graph)
    return graph
