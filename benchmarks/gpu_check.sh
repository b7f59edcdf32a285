#!/bin/bash
# GPU check in one call: every test marked `gpu`, then models on CUDA against eager, eager
# replayed as a CUDA graph and torch.compile (max-autotune, frozen weights), each model's row
# written as soon as it is done. Usage: bash benchmarks/gpu_check.sh OUT [MODEL...]
# Timeouts keep the whole call under 570 s: what finished comes back.
out=${1:?usage: gpu_check.sh OUT [MODEL...]}; shift
models=${*:-hf:bert tv:resnet18 tv:mobilenet_v2}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OLLIE_CACHE_DIR=/tmp/oc
mkdir -p "$out"
nvidia-smi -L
python3 -c "import torch, triton, numba, numpy, torchvision, transformers, onnxruntime; print(torch.__version__, triton.__version__, numba.__version__, numpy.__version__, torchvision.__version__, transformers.__version__, onnxruntime.__version__)"
date -u
timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=5 tests 2>&1 | tee "$out/gpu_tests.log" | tail -25
date -u
timeout 370 python3 -m ollie bench models --device cuda --compile-mode max-autotune --models $models --batches 1 --time-budget 40 --out "$out/suite" 2>&1 | tee "$out/suite.log" | tail -40
date -u
