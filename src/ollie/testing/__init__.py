"""Helpers for tests: hypothesis strategies generating well-formed expressions."""
