"""Bindings to vendor libraries: oneDNN convolutions with packed weights and the calling
convention every convolution implementation follows (:mod:`ollie.libs.onednn`), ONNX Runtime
convolutions (:mod:`ollie.libs.ort_conv`), and kernel inputs read as torch tensors through
their program views (:mod:`ollie.libs.tensors`)."""
