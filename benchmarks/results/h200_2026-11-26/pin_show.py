"""Session 31: what the GPU test's optimized program holds (eOps and their pinned configs)."""
import sys
sys.path.insert(0, "tests/runtime")
import torch, ollie
from test_cuda_configs import _Generator, CUDA_CONFIGS
torch.manual_seed(0)
m = _Generator().eval().cuda()
x = torch.randn(2, 16, 6, 6, device="cuda")
opt = ollie.optimize(m, (x,), device="cuda", time_budget=4.0, max_candidates=4, use_cache=False)
print(opt.summary())
for k in opt.program.kernels:
    print(k.kind, k.output, k.params.get("activation"), k.params.get(CUDA_CONFIGS))
