#!/bin/bash
# GPU check for session 31: pinned CUDA launch configurations (new test) + the CUDA codegen
# and CUDA-graph GPU tests that go through compile_cuda's changed launch path.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OLLIE_CACHE_DIR=/tmp/oc
nvidia-smi -L
date -u
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -x \
  tests/runtime/test_cuda_configs.py tests/runtime/test_cuda_graph.py tests/codegen/test_cuda.py \
  -k "not every_config and not bandwidth" 2>&1 | tee $OUT/gpu_tests.log | tail -25
date -u
