#!/bin/bash
# GPU check: every test marked `gpu`, then torchvision / transformers models on CUDA
# against eager, eager replayed as a CUDA graph and torch.compile (default mode, frozen).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OLLIE_CACHE_DIR=/tmp/oc
nvidia-smi -L
python3 -c "import torch, triton, numba, numpy, torchvision, transformers, onnxruntime; print(torch.__version__, triton.__version__, numba.__version__, numpy.__version__, torchvision.__version__, transformers.__version__, onnxruntime.__version__)"
git log --oneline -1 2>/dev/null
date -u
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=5 tests 2>&1 | tee $OUT/gpu_tests.log | tail -25
date -u
timeout 350 python3 -m ollie bench models --device cuda --models tv:resnet18 tv:mobilenet_v2 hf:bert --batches 1 --time-budget 40 --out $OUT/suite 2>&1 | tee $OUT/suite.log | tail -60
date -u
