"""Matrix products on the CPU through the fastest library: MKL (``torch.matmul``) or oneDNN's
matmul primitive (``torch.ops.mkldnn._linear_pointwise``, the kernel torch.compile's frozen
``Linear`` layers run).

Which one is faster depends on the machine and the shape: PyTorch's CPU build calls MKL for
``torch.matmul``, and MKL on a non-Intel CPU may run its AVX2 code where oneDNN uses AVX-512,
while for a matrix-vector product oneDNN's per-call set-up costs more than the product
(measured: docs/design/003-library-kernels-on-the-cpu.md). So the choice is measured once
per configuration (shapes and strides of the operands), like a cuDNN benchmark-mode algorithm
choice (:meth:`ollie.tune.choice.Choices.fastest`), and every implementation is checked against
``torch.matmul`` on the operands of its first call before it is used.

oneDNN's primitive computes ``x @ w.T`` for an ``x`` of any rank >= 2 and a 2-D ``w``; a product
``a @ b`` with a 2-D ``b`` is ``linear(a, b.T)`` (``b.T`` is a view: no copy), and one with a 2-D
``a`` can also run as ``linear(b.T, a).T`` (made contiguous). A fused ``bias`` (added per output
column) and ``activation`` (``tanh`` / ``sigmoid``) are oneDNN post-ops; ``relu`` is applied by
torch after the primitive, whose ReLU post-op drops NaN (:func:`ollie.libs.onednn.post_op`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ollie.activations import ACTIVATIONS as FUSED
from ollie.activations import identity
from ollie.kernels import blocked_gemm
from ollie.libs import onednn
from ollie.policy import BLOCKED_GEMM, Implementations
from ollie.settings import current
from ollie.tune.choice import Choices, shared

log = logging.getLogger(__name__)
Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""A matrix product ``(a, b) -> f(a @ b + bias)``."""

ACTIVATIONS: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    None: identity, **{n: a.torch_inplace for n, a in FUSED.items()}}
"""Activations the products (and activation epilogues of generated eOperators) apply
(``None``: none; the others: :data:`ollie.activations.ACTIVATIONS`), as in-place torch
functions."""


def available() -> bool:
    """Whether this torch build has oneDNN's matmul primitive."""
    return torch.backends.mkldnn.is_available() and \
        hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D view when its leading dimensions are all 1 (a batch of one matrix), else
    ``t``."""
    if t.dim() > 2 and all(n == 1 for n in t.shape[:-2]):
        return t.view(t.shape[-2:]) if t.is_contiguous() else \
            torch.as_strided(t, t.shape[-2:], t.stride()[-2:], t.storage_offset())
    return t


def _usable(a: torch.Tensor, b: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (a, b)) and \
        available()


def implementations(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                    activation: str | None = None,
                    constant: tuple[bool, bool] = (False, False),
                    impls: Implementations | None = None) -> dict[str, Product]:
    """The implementations of ``(a, b) -> activation(a @ b + bias)`` that can run on operands
    like ``a`` and ``b``: ``"MKL"`` (``torch.matmul``) always, ``"MKL transposed"``
    (``(b.T @ a.T).T``, made contiguous) for 2-D operands, the oneDNN ones where ``b``
    (``"oneDNN"``) or both (``"oneDNN transposed"``, without ``bias``) are matrices (2-D, or a
    batch of one).
    MKL's kernel for a tall product with a transposed first operand and a few columns (a
    strided transposed convolution derived as a product) is slow; the transposed forms compute
    it as the short product (docs/design/003-library-kernels-on-the-cpu.md).
    The oneDNN ones return ``a @ b``'s elements in its row-major order, not always in its
    shape (leading size-1 dimensions may be missing): callers reshape.

    ``constant``: whether ``a`` / ``b`` is a constant of the program (a weight), the same
    tensor on every call. A constant matrix is also offered packed once into oneDNN's blocked
    layout (``"oneDNN packed"`` for ``b``, ``"oneDNN packed transposed"`` for ``a``; the
    returned products then ignore that argument and use the packed copy), and a constant
    ``b`` with a multiple of 16 columns into the panels of the register-blocked kernel
    (``"blocked"``, :mod:`ollie.kernels.blocked_gemm`): oneDNN's primitive
    otherwise re-lays out its weight on every call, which for a product with few rows is most
    of its time (measured: docs/design/003-library-kernels-on-the-cpu.md). ``impls``: the
    implementations allowed (default the settings'; without
    :data:`~ollie.policy.BLOCKED_GEMM` no ``"blocked"``)."""
    post = ACTIVATIONS[activation]
    impls = impls or current().implementations

    def mkl(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.matmul(x, y)
        return post(z if bias is None else z.add_(bias))

    products: dict[str, Product] = {"MKL": mkl}
    if _matrix(a).dim() == 2 and _matrix(b).dim() == 2:
        def mkl_transposed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = torch.matmul(_matrix(y).t(), _matrix(x).t()).t().contiguous()
            return post(z if bias is None else z.add_(bias))

        products["MKL transposed"] = mkl_transposed
    if not _usable(a, b):
        return products
    op = torch.ops.mkldnn._linear_pointwise
    attr, after = onednn.post_op(activation)  # ReLU by torch after: NaN kept
    if _matrix(b).dim() == 2:
        products["oneDNN"] = lambda x, y: after(op(x, _matrix(y).t(), bias, attr, [], ""))
    if _matrix(a).dim() == 2 and _matrix(b).dim() == 2 and bias is None:
        # (a @ b) = (b.T @ a.T).T: a as the primitive's weight, the result transposed back
        products["oneDNN transposed"] = lambda x, y: post(
            op(_matrix(y).t(), _matrix(x), None, "none", [], "").t().contiguous())
    if constant[1] and _matrix(b).dim() == 2:
        rows = a.numel() // max(a.shape[-1], 1)
        products["oneDNN packed"] = _packed(_matrix(b).t(), rows, lambda x, w: after(op(
            x, w, bias, attr, [], "")))
    if constant[1] and _matrix(b).dim() == 2 and impls.allows(BLOCKED_GEMM) and \
            blocked_gemm.applies(_matrix(b).shape[1]):
        products["blocked"] = _blocked(_matrix(b), bias, post)
    if constant[0] and _matrix(a).dim() == 2 and _matrix(b).dim() == 2 and bias is None:
        products["oneDNN packed transposed"] = _packed(_matrix(a), _matrix(b).shape[1], (
            lambda y, w: post(op(_matrix(y).t(), w, None, "none", [], "").t().contiguous())),
            operand=1)
    return products


def _packed(weight: torch.Tensor, rows: int, call: Callable[[torch.Tensor, torch.Tensor],
            torch.Tensor], operand: int = 0) -> Product:
    """A product running ``call(args[operand], packed)`` with ``weight`` (``[out, in]``)
    packed for oneDNN once, on its first call (building the candidates packs nothing); it
    ignores its other argument, the constant ``weight`` came from."""
    reorder = torch.ops.mkldnn._reorder_linear_weight
    packed: list[torch.Tensor] = []

    def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not packed:
            packed.append(reorder(weight.contiguous(), max(rows, 1)))
        return call((x, y)[operand], packed[0])

    return run


def _blocked(weight: torch.Tensor, bias: torch.Tensor | None,
             post: Callable[[torch.Tensor], torch.Tensor]) -> Product:
    """A product by the register-blocked kernel of :mod:`ollie.kernels.blocked_gemm` with the
    constant ``weight`` (``[in, out]``) packed into its panels on the first call; it ignores
    its second argument, like :func:`_packed`."""
    k, n = weight.shape
    built: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = []

    def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not built:
            built.append(blocked_gemm.blocked_products(weight.t().unsqueeze(0)))
        rows = x.reshape(-1, k).contiguous()
        z = built[0](rows.view(-1, 1, k), torch.empty(rows.shape[0], 1, n))
        z = z.view(*x.shape[:-1], n)
        return post(z if bias is None else z.add_(bias))

    return run


def _output(fn: Product, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """``fn(a, b)``, or None where it fails (logged)."""
    try:
        return fn(a, b)
    except (RuntimeError, NotImplementedError) as exc:
        log.info("matmul %s x %s: an implementation failed: %s", list(a.shape),
                 list(b.shape), exc)
        return None


def _close(got: torch.Tensor | None, want: torch.Tensor) -> bool:
    """Whether ``got`` holds ``want``'s values within 1e-3 of its largest magnitude."""
    if got is None or got.numel() != want.numel():
        return False
    scale = float(want.abs().max()) + 1e-6
    return float((got.reshape(want.shape) - want).abs().max()) <= 1e-3 * scale


def best_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str | None = None, prefer: str | None = None,
                 constant: tuple[bool, bool] = (False, False),
                 choices: Choices | None = None, impls: Implementations | None = None
                 ) -> tuple[str, Product]:
    """``(name, fn)``: the fastest implementation (:func:`implementations`) for operands with
    the shapes and strides of ``a`` and ``b``, measured on them (alternately, cold caches, via
    :meth:`ollie.tune.choice.Choices.fastest`) and remembered per configuration; ``prefer``: use
    that implementation without measuring when it runs correctly. An implementation that
    disagrees with ``torch.matmul`` on ``a`` and ``b`` is never used. ``constant``: see
    :func:`implementations` (the caller passes the same constant operand on every call).
    Another implementation replaces ``MKL`` (``torch.matmul``, what the framework calls) only
    when measured faster with confidence (:meth:`ollie.tune.choice.Choices.fastest`).
    ``choices``: the table asked (default :func:`ollie.tune.choice.shared`); ``impls``: the
    implementations allowed (:func:`implementations`), part of the choice's key."""
    name, fn, _ = chosen_product(a, b, bias, activation, prefer, constant, choices, impls)
    return name, fn


def chosen_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                   activation: str | None = None, prefer: str | None = None,
                   constant: tuple[bool, bool] = (False, False),
                   choices: Choices | None = None, impls: Implementations | None = None
                   ) -> tuple[str, Product, torch.Tensor | None]:
    """:func:`best_product`'s ``(name, fn)`` and ``fn(a, b)`` where computing it was part of
    the choice (a remembered or preferred implementation run on ``a`` and ``b`` to check it
    against ``torch.matmul``; computed in the caller's grad mode), else None: a caller that
    needs the product of these operands uses it rather than computing it again. With the
    settings' ``check_choices`` off, a remembered or preferred implementation is used
    unchecked."""
    policy = impls or current().implementations
    key = ("matmul", tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), bias is None,
           activation, constant, *((policy.key,) if policy.key else ()))
    products = implementations(a, b, bias, activation, constant, policy)
    choices = choices if choices is not None else shared()
    chosen = prefer if prefer in products else choices.get(key)
    # MKL is what torch.matmul computes: nothing to check it against; without
    # ``check_choices`` the caller checks what the product feeds (a recalled program's run)
    if chosen == "MKL" or (chosen in products and not current().check_choices):
        return chosen, products[chosen], None
    with torch.inference_mode():
        want = products["MKL"](a, b)
    if chosen in products:
        got = _output(products[chosen], a, b)
        if _close(got, want):
            return chosen, products[chosen], got
    with torch.inference_mode():
        usable: dict[str, Product | None] = {
            n: f if n == "MKL" or _close(_output(f, a, b), want) else None
            for n, f in products.items()}
        fn = choices.fastest(usable, tuple(a.shape), key, make_args=lambda: (a, b),
                             baseline="MKL")
    # remembered by ``fastest`` only when measured (operands with NaN or inf make every other
    # implementation fail its check: MKL then, for the caller that saw them) and confirmed
    name = next(n for n, f in usable.items() if f is fn)
    log.debug("matmul %s x %s: %s", list(a.shape), list(b.shape), name)
    return name, fn, None


PRODUCT_OPS = ("MatMul", "Gemm")
"""Graph operators :func:`node_runner` runs through :func:`best_product`."""


def node_runner(op: str, attrs: dict, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None = None, residual: bool = False,
                impls: Implementations | None = None) -> Callable[..., torch.Tensor] | None:
    """For a ``MatMul`` / ``Gemm`` graph node whose second input (and bias) are constants: a
    callable ``x -> f(op(x))`` (with ``residual``, ``(x, r) -> f(op(x) + r)``) through the
    :func:`best_product` implementation, chosen on the first call for each input shape and
    layout, with Gemm's ``alpha`` folded into the weight and ``beta * C`` into the bias once.
    ``None`` for other nodes and for what it does not cover (a transposed first operand, a
    bias that is not one value per output column, a weight that is not 2-D). ``impls``: the
    implementations allowed (:func:`best_product`)."""
    if op not in PRODUCT_OPS or activation not in ACTIVATIONS or weight.dim() != 2 or \
            weight.dtype != torch.float32 or weight.device.type != "cpu" or not available():
        return None
    w, c = weight.detach(), None
    if op == "Gemm":
        if attrs.get("transA", 0):
            return None
        w = w.t() if attrs.get("transB", 0) else w
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        w = (w * alpha) if alpha != 1.0 else w
        if bias is not None and beta != 0.0:
            if bias.numel() not in (1, w.shape[1]):
                return None
            c = (bias.detach().reshape(-1) * beta).expand(w.shape[1]).contiguous()
    elif bias is not None:
        return None
    w = w.contiguous()
    act = None if residual else activation
    post = ACTIVATIONS[activation]
    cache: dict[tuple, Product] = {}

    def run(x: torch.Tensor, *residual_input: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.stride())
        fn, y = cache.get(key), None
        if fn is None:  # chosen for this input; its product, when the choice computed it
            _, fn, y = chosen_product(x, w, c, act, constant=(False, True), impls=impls)
            cache[key] = fn
        y = fn(x, w) if y is None else y
        y = y.reshape(*x.shape[:-1], w.shape[1])
        if residual_input:
            y = post(y.add_(residual_input[0]))
        return y

    return run
