#!/bin/bash
# GPU check for session 33: every test marked `gpu` (35), among them the three of
# tests/runtime/test_cuda_configs.py that had not run on a GPU since they were written.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OLLIE_CACHE_DIR=/tmp/oc
nvidia-smi -L
python3 -c "import torch, triton, numba, numpy; print(torch.__version__, triton.__version__, numba.__version__, numpy.__version__)"
date -u
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=8 tests 2>&1 | tee $OUT/gpu_tests.log | tail -40
date -u
