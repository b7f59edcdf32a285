"""Bindings to vendor libraries: oneDNN convolutions with packed weights
(:mod:`ollie.libs.onednn`), ONNX Runtime convolutions (:mod:`ollie.libs.ort_conv`), and the
calling convention every convolution implementation follows (:mod:`ollie.libs.convs`)."""
