"""The options of ``ollie.optimize`` (:class:`OptimizeConfig`), checked when made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ollie.errors import check_settings
from ollie.optimizer.budget import AUTO
from ollie.policy import VENDOR_ONLY, Implementations
from ollie.search.config import GUIDED_DEPTH
from ollie.settings import current
from ollie.tune.measure import SETTLE_SECONDS


@dataclass(frozen=True)
class OptimizeConfig:
    """Settings of :func:`ollie.optimizer.model.optimize` (the CLI maps its flags onto
    these).

    ``kernel_library``: the program may run on Ollie's hand-written kernels (Winograd
    convolutions, the blocked GEMM, the band kernels, max pooling; :mod:`ollie.policy`) where
    they measure faster; off, on the vendor libraries only (oneDNN, MKL, PyTorch, ONNX
    Runtime, cuDNN / cuBLAS), in the search's measurements, the library choices and the
    returned program alike. ``derivation``: each subprogram is derived and its fastest
    verified program chosen; off, every subprogram keeps its original operator (no search),
    while the rest of the pipeline (post-processing, library choice, the end-to-end check)
    runs as usual. ``total_budget``: seconds of wall-clock time for the whole optimisation,
    every phase of it inside (:mod:`ollie.optimizer.budget`); by default ``"auto"``: 30 s
    plus 1.25 s per distinct subprogram, at most 120 s
    (:func:`~ollie.optimizer.budget.default_total`); None: unbounded. Each distinct
    subprogram then searches for its share of what is left (at most ``time_budget``) and only
    its few plausible candidates are built (:mod:`ollie.optimizer.plausible`); once it is
    spent the remaining subprograms keep their original operators, or a decision made before,
    and the best program so far is checked and returned. ``time_budget`` stays the search
    seconds per distinct subprogram (its cap).
    ``derive_regions``: a linear region of two or more compute operators
    (:func:`ollie.graph.partition.partition`, none in a sibling group or chain) is derived as
    one subprogram with the inter-expression rules (:mod:`ollie.optimizer.regions`; GCN's
    global-convolution block merged by the rules' sum mode) and kept when faster than its
    nodes decided alone; off, its nodes are decided alone only.
    ``max_depth``: explorative derivation steps per subprogram; ``guided_depth``: guided steps
    per scope toward library operators (:class:`ollie.search.config.SearchConfig`); fewer
    make a search that reaches its end sooner, finding what lies within fewer steps."""

    device: str = "cpu"
    max_depth: int = 2
    guided_depth: int = GUIDED_DEPTH  # guided steps per scope toward library operators
    time_budget: float = 30.0     # seconds of search per distinct subprogram
    # seconds for the whole model ("auto": scaled with its subprograms; None: unbounded)
    total_budget: float | Literal["auto"] | None = AUTO
    max_candidates: int = 8       # candidates measured per subprogram
    use_cache: bool = True
    check_rtol: float = 1e-3
    seed: int = 0
    choose_libraries: bool = True  # CPU: time per-operator vs uniform convolution libraries
    context: bool = True          # CPU: switch each rewrite on / off in the whole program
    merge_siblings: bool = True   # sibling operators (Q/K/V) as one subprogram when faster
    fuse_chains: bool = True      # window/pad/product chains into a sum as one subprogram
    derive_regions: bool = True   # linear regions of >= 2 compute operators as one subprogram
    # CPU: seconds the cores idle before a sample next to an ONNX Runtime session whose threads
    # spin, in the whole-program comparisons (libraries, context); 0 skips it: a faster
    # optimisation whose comparisons of such programs are less faithful (the test suite)
    settle: float = SETTLE_SECONDS
    kernel_library: bool = True   # Ollie's hand-written kernels allowed (ollie.policy)
    derivation: bool = True       # subprograms derived and searched; off: originals kept

    def __post_init__(self) -> None:
        kind, _, index = self.device.partition(":") if isinstance(self.device, str) else ("",
                                                                                        "", "")
        check_settings("OptimizeConfig", {
            "device": (self.device, kind in ("cpu", "cuda") and (not index or index.isdigit())
                       and (kind != "cuda" or torch.cuda.is_available()),
                       "'cpu', or 'cuda' / 'cuda:N' on a machine with a CUDA GPU"),
            "max_depth": (self.max_depth, self.max_depth >= 0, ">= 0"),
            "guided_depth": (self.guided_depth, self.guided_depth >= 0, ">= 0"),
            "time_budget": (self.time_budget, self.time_budget > 0, "> 0 seconds"),
            "total_budget": (self.total_budget, self.total_budget in (None, AUTO) or (
                isinstance(self.total_budget, (int, float)) and self.total_budget > 0),
                "None, 'auto' or > 0 seconds"),
            "max_candidates": (self.max_candidates, self.max_candidates >= 0, ">= 0"),
            "check_rtol": (self.check_rtol, self.check_rtol > 0, "> 0"),
            "settle": (self.settle, self.settle >= 0, ">= 0 seconds"),
        })

    def implementations(self) -> Implementations:
        """The implementation policy the optimisation runs under: the settings'
        (:attr:`ollie.settings.Settings.implementations`), or the vendor libraries only when
        :attr:`kernel_library` is off."""
        return current().implementations if self.kernel_library else VENDOR_ONLY

    def switch_notes(self) -> list[str]:
        """Notes for the report saying which of :attr:`derivation` and :attr:`kernel_library`
        were off (none when both are on)."""
        out = []
        if not self.derivation:
            out.append("derivation off: every subprogram kept its original operator (no "
                       "search)")
        if not self.kernel_library:
            out.append(f"kernel library off: {self.implementations().describe()}")
        return out


__all__ = ["OptimizeConfig"]
