"""Digests for the whole-model result cache (:mod:`ollie.optimizer.recall`).

:func:`module_key` names a torch module as ``ollie.optimize`` would optimise it without
importing it (``torch.export`` is most of a warm run's time): every submodule's class, the
code of its ``forward`` (an ``fx.GraphModule``'s generated source), its other attributes, every
parameter's and buffer's bytes (digested on several threads), the example inputs' shapes and
dtypes, and the settings. It is a lookup key only: a program found under it is used after it
matched the module itself on random and example inputs, like any recalled program, so a
forward that reads something the key does not cover (a global, a helper function's code) can
cost a wasted lookup, never a wrong program. :func:`feed` adds a value to a digest, for this
key and the graph's; both are SHA-256 digests (why, with the figures:
docs/design/036-module-key.md).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import re
import types
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

import numpy as np
import torch

from ollie.optimizer.config import OptimizeConfig
from ollie.tune.cache import device_key

log = logging.getLogger(__name__)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

_INTERNAL = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                       "training", "_is_torch_compile", "_compiled_call_impl"})
"""A module's own attributes the key covers otherwise (tensors, children) or separately, and
the marks ``torch.compile(module)`` and ``module.compile()`` leave on it, which do not change
what it computes (a module compiled before ``ollie.optimize`` keeps its key)."""


def version() -> str:
    """Ollie's installed version ("source" when run from a source tree)."""
    try:
        return importlib.metadata.version("ollie")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "source"


def feed(h: Any, value: object) -> None:
    """Add ``value`` to the digest ``h``: arrays and tensors by dtype, shape and bytes,
    containers element by element (sets in the order of their elements' text, which holds
    across processes), anything else by its text (memory addresses removed, so that a
    callable is named by what it is)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy() if value.device.type != "meta" else repr(value)
    if isinstance(value, np.ndarray):
        h.update(f"array{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value))  # the buffer itself: no copy when contiguous
    elif isinstance(value, dict):
        h.update(b"{")
        for k in sorted(value, key=str):
            feed(h, k)
            feed(h, value[k])
        h.update(b"}")
    elif isinstance(value, (set, frozenset)):  # in an order that does not depend on the
        h.update(b"set(")                      # process's string hashing (PYTHONHASHSEED)
        for v in sorted(value, key=_text):
            feed(h, v)
        h.update(b")")
    elif isinstance(value, (list, tuple)):
        h.update(b"(")
        for v in value:
            feed(h, v)
        h.update(b")")
    elif hasattr(value, "SerializeToString"):  # an ONNX node of an opaque operator
        h.update(value.SerializeToString())
    else:
        h.update(_text(value).encode())
        h.update(b";")


def _text(value: object) -> str:
    """``repr(value)`` without memory addresses: an order for a set's elements."""
    return _ADDRESS.sub("", repr(value))


def settings_digest(h: Any, cfg: OptimizeConfig) -> None:
    """Add Ollie's version, the device description and every setting of ``cfg`` to ``h``."""
    feed(h, ("ollie", version(), device_key(cfg.device),
             {f.name: getattr(cfg, f.name) for f in fields(cfg)}))


def _hooked(module: torch.nn.Module) -> bool:
    """Whether a forward hook could change what ``module`` computes (then no key)."""
    from torch.nn.modules import module as torch_module

    glob = [getattr(torch_module, n, None) for n in
            ("_global_forward_hooks", "_global_forward_pre_hooks")]
    if any(glob):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def _feed_code(h: Any, module: torch.nn.Module) -> None:
    """Add what ``module``'s forward runs to ``h``: an fx graph's source, else the forward's
    code (:func:`_feed_code_object`)."""
    if isinstance(module, torch.fx.GraphModule):
        h.update(module.code.encode())
        return
    fwd = getattr(type(module).forward, "__code__", None)
    if fwd is None:
        h.update(repr(type(module).forward).encode())
    else:
        _feed_code_object(h, fwd)


def _feed_code_object(h: Any, code: types.CodeType) -> None:
    """Add a code object's bytecode, names, flags and constants to ``h`` (nested code objects
    likewise, other constants by :func:`feed`, so a constant set is digested in a fixed order).
    Not ``marshal.dumps``: its output depends on the objects' reference counts (it marks
    objects referenced more than once), which change when something else, torch.compile's
    tracing for one, holds on to them."""
    h.update(code.co_code)
    feed(h, (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
             code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags))
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            h.update(b"code(")
            _feed_code_object(h, c)
            h.update(b")")
        else:
            feed(h, c)


def _digests(arrays: Sequence[np.ndarray | None]) -> list[bytes | None]:
    """The SHA-256 digest of each array's bytes (None for None), on up to PyTorch's number of
    threads at once: hashlib lets other threads run while it digests a large buffer, and a
    model's weights are most of the time its key takes."""
    def one(a: np.ndarray | None) -> bytes | None:
        return None if a is None else hashlib.sha256(np.ascontiguousarray(a).data).digest()

    workers = min(torch.get_num_threads(), len(arrays))
    if workers < 2:
        return [one(a) for a in arrays]
    with ThreadPoolExecutor(workers, thread_name_prefix="ollie-key") as pool:
        return list(pool.map(one, arrays))


def module_key(module: torch.nn.Module, inputs: Sequence[object] | torch.Tensor | None,
               cfg: OptimizeConfig) -> str | None:
    """The digest naming ``module`` called on inputs like ``inputs`` and optimised with
    ``cfg`` (see the module docstring); None where it names nothing reliably: a module in
    training mode, one with forward hooks, inputs that are not all tensors."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)) or module.training or _hooked(module):
        return None  # (the import says what is wrong with inputs of another kind)
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if len(tensors) != len(inputs):
        return None
    h = hashlib.sha256()
    settings_digest(h, cfg)
    feed(h, ("module", [(tuple(x.shape), str(x.dtype)) for x in tensors]))
    try:
        for name, m in module.named_modules(remove_duplicate=False):
            cls = type(m)
            feed(h, (name, cls.__module__, cls.__qualname__, m.training))
            _feed_code(h, m)
            feed(h, {k: v for k, v in vars(m).items()
                     if k not in _INTERNAL and not k.endswith("hooks")})
        named = [*module.named_parameters(remove_duplicate=False),
                 *module.named_buffers(remove_duplicate=False)]
        data = [t.detach().cpu().numpy() if t.device.type != "meta" else None
                for _, t in named]
        for (name, t), digest in zip(named, _digests(data), strict=True):
            feed(h, (name, t if digest is None else f"array{t.dtype}{tuple(t.shape)}"))
            h.update(digest or b"")
    except Exception as exc:  # an attribute it cannot digest (a failing __repr__): no key
        log.info("no module key (%s: %s): the graph's key is used", type(exc).__name__, exc)
        return None
    return h.hexdigest()[:40]


__all__ = ["feed", "module_key", "settings_digest", "version"]
