"""Running programs: the executor (:mod:`ollie.exec.executor`), per-kernel dispatch
(:mod:`ollie.exec.dispatch`), the reference executor (:mod:`ollie.exec.reference`), output
buffers, CUDA graphs, precision switches, and the per-operator choice between library bindings
and hand-written kernels (:mod:`ollie.exec.conv`, :mod:`ollie.exec.linear`)."""
