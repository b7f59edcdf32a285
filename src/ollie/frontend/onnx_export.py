"""ONNX export of PyTorch modules (the zoo models): ``to_onnx`` / ``to_onnx_model``.

Uses PyTorch's TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``; the
dynamo exporter needs ``onnxscript``, which is not a dependency), opset 17, eval mode, with
constant folding (so inference BatchNorm is folded into the convolutions by the exporter).
The ``ollie::g2bmm`` / ``ollie::gbmm`` custom operators are exported as nodes ``G2BMM`` /
``GBMM`` of the custom domain ``ollie`` (attributes ``width``, ``dilation``), which
:func:`ollie.frontend.from_onnx` imports; ONNX Runtime itself cannot run such a model (no
kernel for the custom domain), so the Longformer layer's ONNX file is for Ollie only.

While it exports, torch enables its C++ ONNX log (``setup_onnx_logging``), which prints the
whole TorchScript graph (to stdout) when the export fails. The export runs with file
descriptors 1 and 2 redirected to temporary files (:func:`_captured_output`): on success what
was written there is passed on, on failure it is dropped and the raised
:class:`~ollie.errors.OllieError` says why in one line.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

import ollie.zoo.ops  # noqa: F401 - registers torch.ops.ollie.*
from ollie.errors import OllieError

OPSET = 17
CUSTOM_DOMAIN = "ollie"
_registered = False


def _register_symbolics() -> None:
    global _registered
    if _registered:
        return
    from torch.onnx import register_custom_op_symbolic
    from torch.onnx.symbolic_helper import _get_const

    def band(op: str) -> Any:
        def symbolic(g: Any, a: Any, b: Any, width: Any, dilation: Any) -> Any:
            w = _get_const(width, "i", "width")
            d = _get_const(dilation, "i", "dilation")
            return g.op(f"{CUSTOM_DOMAIN}::{op}", a, b, width_i=int(w), dilation_i=int(d))

        return symbolic

    register_custom_op_symbolic("ollie::g2bmm", band("G2BMM"), 1)
    register_custom_op_symbolic("ollie::gbmm", band("GBMM"), 1)
    _registered = True


UNUSED_DOMAIN = f"Custom opset domain: '{CUSTOM_DOMAIN}' provided is not used"
"""torch's warning for a model without the ``ollie`` operators, exported (as every model)
with the ``ollie`` domain declared: not passed on (:func:`_captured_output`)."""


@contextlib.contextmanager
def _captured_output() -> Iterator[None]:
    """Redirect file descriptors 1 and 2 (C++ and Python writes alike) to temporary files for
    the block; what was written is passed on to stdout / stderr if the block succeeds (less
    the lines of :data:`UNUSED_DOMAIN`), dropped if it raises."""
    streams = ((1, sys.stdout), (2, sys.stderr))
    with contextlib.ExitStack() as stack:
        saved: list[tuple[int, int, Any, Any]] = []
        for fd, stream in streams:
            stream.flush()
            tmp = stack.enter_context(tempfile.TemporaryFile())
            saved.append((fd, os.dup(fd), tmp, stream))
            os.dup2(tmp.fileno(), fd)
        ok = False
        try:
            yield
            ok = True
        finally:
            for fd, old, tmp, stream in saved:
                stream.flush()
                os.dup2(old, fd)
                os.close(old)
                tmp.seek(0)
                text = "".join(line for line in
                               tmp.read().decode(errors="replace").splitlines(keepends=True)
                               if UNUSED_DOMAIN not in line)
                if ok and text:
                    stream.write(text)


def _names(n: int, base: str) -> list[str]:
    return [base] if n == 1 else [f"{base}_{k}" for k in range(n)]


def _export(module: torch.nn.Module, example_inputs: Any, f: Any, opset: int,
            input_names: Sequence[str] | None, output_names: Sequence[str] | None) -> None:
    _register_symbolics()
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
        else tuple(example_inputs)
    with torch.no_grad():
        outs = module(*args)
    n_out = len(outs) if isinstance(outs, (tuple, list)) else 1
    was_training = module.training
    module.eval()
    try:
        with warnings.catch_warnings(), _captured_output():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, args, f, dynamo=False, opset_version=opset,
                input_names=list(input_names or _names(len(args), "input")),
                output_names=list(output_names or _names(n_out, "output")),
                custom_opsets={CUSTOM_DOMAIN: 1}, do_constant_folding=True)
    except Exception as e:
        raise OllieError(f"ONNX export of {type(module).__name__} failed: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else e!r}") from e
    finally:
        module.train(was_training)


def to_onnx(module: torch.nn.Module, example_inputs: Any, path: str | Path, *,
            opset: int = OPSET, input_names: Sequence[str] | None = None,
            output_names: Sequence[str] | None = None) -> Path:
    """Export ``module`` traced on ``example_inputs`` to the ONNX file ``path``; inputs are
    named ``input`` (``input_0, input_1, ...`` for several), outputs ``output``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _export(module, example_inputs, str(path), opset, input_names, output_names)
    return path


def to_onnx_model(module: torch.nn.Module, example_inputs: Any, *, opset: int = OPSET,
                  input_names: Sequence[str] | None = None,
                  output_names: Sequence[str] | None = None) -> Any:
    """Like :func:`to_onnx`, returning the ``onnx.ModelProto`` instead of writing a file."""
    import onnx

    buf = io.BytesIO()
    _export(module, example_inputs, buf, opset, input_names, output_names)
    return onnx.load_from_string(buf.getvalue())
