"""Whole-region backends: runs of program kernels handed to another runtime as one unit."""
