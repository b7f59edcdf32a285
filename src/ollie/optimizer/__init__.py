"""Program-level optimisation: measured selection, subprograms, whole models."""
