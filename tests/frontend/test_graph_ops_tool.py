"""tools/graph_ops.py: op counts, opaque reasons and regions of a ViT block written with
``nn.MultiheadAttention``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_graph_ops_reports_the_attention_boundaries() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "graph_ops.py"), "vit_block",
                          "--opt", "seq=5", "--opt", "dim=16", "--opt", "heads=2",
                          "--opt", "mlp=32"], capture_output=True, text=True, env=env,
                         check=True, timeout=300).stdout
    assert "Slice x3" in out
    assert "opaque nodes: 4" in out
    assert "Opaque[scaled_dot_product_attention] (aten::scaled_dot_product_attention.default)" \
        ": no converter" in out
    assert "select" not in out and "unflatten" not in out
    assert "regions of lowerable nodes: 3;" in out
