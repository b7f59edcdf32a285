"""ONNX Runtime regions: runs of program kernels emitted as one ONNX model and run as one
session (:mod:`ollie.backends.onnxrt.region`)."""
