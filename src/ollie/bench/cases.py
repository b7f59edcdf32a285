"""The operator cases (MODELS.md, the paper's Table 3, and the issue's must-find list) as
expression text, each with the program the search must find by itself, as a predicate on
candidates. Used by the search benchmark, the operator benchmark and the tests (which use the
``small`` sizes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ollie.program.kernel import Kernel
from ollie.program.params import ConvParams, G2BMMParams, GBMMParams, KernelKind


def _lib(kernels: list[Kernel], kind: str) -> list[Kernel]:
    return [k for k in kernels if k.kind is KernelKind(kind)]


def _convs(kernels: list[Kernel]) -> list[ConvParams]:
    return [k.params for k in kernels if isinstance(k.params, ConvParams)]


def to_matmul(c) -> bool:
    """Exactly one Matmul and otherwise only eOperators."""
    return len(_lib(c.kernels, KernelKind.MATMUL)) == 1 and \
        not c.library_kinds.count(KernelKind.CONV)


def to_conv3x3(c) -> bool:
    """Only non-dilated convolutions with taps of at most 3x3 (at least one 3-wide)."""
    convs = _convs(c.kernels)
    return bool(convs) and len(c.library_kinds) == len(convs) and all(
        p.r <= 3 and p.s <= 3 and p.dh == 1 and p.dw == 1 for p in convs) and \
        any(3 in (p.r, p.s) for p in convs)


def undilated_conv(c) -> bool:
    """One non-dilated Conv (over re-laid-out input) and eOperators."""
    convs = _convs(c.kernels)
    return len(convs) == 1 and len(c.library_kinds) == 1 and \
        convs[0].dh == 1 and convs[0].dw == 1 and convs[0].r > 1 and convs[0].s > 1


def undilated(kind: str) -> Callable:
    def pred(c) -> bool:
        ks = [k.params for k in _lib(c.kernels, kind)
              if isinstance(k.params, G2BMMParams | GBMMParams)]
        return len(ks) == 1 and len(c.library_kinds) == 1 and ks[0].d == 1
    pred.__doc__ = f"One non-dilated {kind} (over re-laid-out data) and eOperators."
    return pred


def single_matmul(c) -> bool:
    """One Matmul reading its operands in place: no copies at all."""
    return len(c.kernels) == 1 and c.kernels[0].kind is KernelKind.MATMUL


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    small: str
    target: Callable
    what: str


def conv_text(n: int, c: int, h: int, w: int, f: int, r: int, s: int, ph: int,
              pw: int | None = None, d: int = 1) -> str:
    """A 2-D convolution (NCHW input ``A``, FCRS weight ``K``, padding ``ph``/``pw``, dilation
    ``d``, stride 1)."""
    pw = ph if pw is None else pw
    tap_r, tap_s = ("r", "s") if d == 1 else (f"{d}*r", f"{d}*s")
    return (f"A: [{n}, {c}, {h}, {w}]\nK: [{f}, {c}, {r}, {s}]\n"
            f"L<n=0:{n}, f=0:{f}, h=0:{h}, w=0:{w}> Sum<c=0:{c}, r=0:{r}, s=0:{s}> "
            f"A[n, c, h + {tap_r} - {ph}, w + {tap_s} - {pw}] * K[f, c, r, s]\n")


def tconv_text(n: int, ci: int, h: int, co: int) -> str:
    """A 4x4 stride-2, padding-1 transposed convolution of an ``h`` x ``h`` input."""
    return (f"X: [{n}, {ci}, {h}, {h}]\nW: [{ci}, {co}, 4, 4]\n"
            f"L<n=0:{n}, c=0:{co}, h=0:{2 * h}, w=0:{2 * h}> Sum<f=0:{ci}, y=0:{h}, x=0:{h}> "
            "X[n, f, y, x] * W[f, c, h + 1 - 2*y, w + 1 - 2*x]\n")


def g2bmm_text(b: int, m: int, k: int, w: int, d: int) -> str:
    """A G2BMM (band ``2w+1``, dilation ``d``) of ``b`` batches of ``m`` x ``k``."""
    return (f"Q: [{b}, {m}, {k}]\nK: [{b}, {m}, {k}]\n"
            f"L<b=0:{b}, i=0:{m}, j=0:{2 * w + 1}> Sum<k=0:{k}> "
            f"Q[b, i, k] * K[b, i + {d}*j - {d * w}, k]\n")


def gbmm_text(b: int, m: int, n: int, w: int, d: int) -> str:
    """A GBMM (band ``2w+1``, dilation ``d``) of ``b`` batches, ``m`` rows, ``n`` columns."""
    return (f"S: [{b}, {m}, {2 * w + 1}]\nV: [{b}, {m}, {n}]\n"
            f"L<b=0:{b}, i=0:{m}, n=0:{n}> Sum<j=0:{2 * w + 1}> "
            f"S[b, i, j] * V[b, i + {d}*j - {d * w}, n]\n")


CASES: dict[str, Case] = {c.name: c for c in [
    Case("conv3x3", conv_text(1, 512, 7, 7, 512, 3, 3, 1), conv_text(1, 16, 7, 7, 16, 3, 3, 1),
         to_matmul, "Conv3x3 (ResNet-18) -> Matmul + OffsetAdd"),
    Case("conv1x7", conv_text(1, 128, 17, 17, 128, 1, 7, 0, 3),
         conv_text(1, 16, 9, 9, 16, 1, 7, 0, 3),
         to_matmul, "Conv1x7 -> Matmul + eOperators"),
    Case("convtranspose", tconv_text(16, 448, 2, 256), tconv_text(2, 32, 2, 16), to_matmul,
         "ConvTranspose 4x4 s2 p1 (InfoGAN) -> Matmul + selective add"),
    Case("conv5x5", conv_text(16, 32, 224, 224, 1, 5, 5, 2), conv_text(2, 8, 20, 20, 1, 5, 5, 2),
         to_conv3x3, "Conv5x5 (SRCNN) -> Conv3x3 + eOperators"),
    Case("conv9x9", conv_text(1, 1, 224, 224, 64, 9, 9, 4), conv_text(1, 2, 20, 20, 4, 9, 9, 4),
         to_conv3x3, "Conv9x9 (SRCNN) -> Conv3x3 + eOperators"),
    Case("dilated_conv", conv_text(1, 512, 14, 14, 512, 3, 3, 2, d=2),
         conv_text(1, 16, 14, 14, 16, 3, 3, 2, d=2), undilated_conv,
         "dilated Conv (CSRNet) -> non-dilated Conv over re-laid-out input"),
    Case("g2bmm", g2bmm_text(8, 10000, 64, 1000, 4), g2bmm_text(2, 400, 16, 50, 4),
         undilated("G2BMM"),
         "dilated G2BMM (Longformer) -> non-dilated G2BMM + layout eOperators"),
    Case("gbmm", gbmm_text(8, 10000, 64, 1000, 4), gbmm_text(2, 400, 16, 50, 4), undilated("GBMM"),
         "dilated GBMM (Longformer) -> non-dilated GBMM + layout eOperators"),
    Case("matmul_transposed",
         "A: [512, 1024]\nB: [768, 512]\nL<m=0:1024, n=0:768> Sum<k=0:512> A[k, m] * B[n, k]\n",
         "A: [32, 64]\nB: [48, 32]\nL<m=0:64, n=0:48> Sum<k=0:32> A[k, m] * B[n, k]\n",
         single_matmul, "Matmul over transposed operands -> one Matmul, no copies"),
    Case("matmul_strided",
         "C: [4, 2, 64, 65]\nD: [5, 4, 64, 32]\n"
         "L<b=1:4, m=0:64, n=0:32> Sum<k=0:64> C[b, 0, m, 1 + k] * D[b - 1, b, k, n]\n",
         "C: [4, 2, 8, 9]\nD: [5, 4, 8, 6]\n"
         "L<b=1:4, m=0:8, n=0:6> Sum<k=0:8> C[b, 0, m, 1 + k] * D[b - 1, b, k, n]\n",
         single_matmul, "the paper's strided batched Matmul -> one Matmul on views"),
]}
