"""Program rewrites after derivation: eOperator fusion, epilogues, identity elimination,
compile-time weights (:mod:`ollie.passes.postprocess`) and operand orientation
(:mod:`ollie.passes.orient`)."""
