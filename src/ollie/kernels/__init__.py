"""The hand-written kernel library: Winograd convolutions, the register-blocked GEMM, banded
matrix products and pooling, each a library operator like a vendor's."""
