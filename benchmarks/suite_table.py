"""A compact table of an ``ollie bench models`` run, as in the suite results pages:
``python benchmarks/suite_table.py OUT/models.json``."""

from __future__ import annotations

import json
import math
import sys

HEADER = ("| model | eager ms | torch.compile ms | ORT ms | Ollie ms | vs best peer | cold s "
          "| warm s | derived / original / refused |")


def _subprograms(s: object) -> str:
    if not isinstance(s, dict):
        return str(s)
    why = ", ".join(f"{k} {v}" for k, v in (s.get("reasons") or {}).items())
    return f"{s.get('derived')} / {s.get('original')} / {s.get('refused')}" + \
        (f" ({why})" if why else "")


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    print(HEADER)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    logs = []
    for r in rows:
        t = r["times_ms"]
        sp = r["speedup_vs_best"]
        logs.append(math.log(sp))
        peers = " | ".join(f"{t.get(n, math.nan):.2f}" for n in ("eager", "torch.compile", "ORT"))
        print(f"| {r['model']} | {peers} | {t['Ollie']:.2f} | {sp:.2f}x ({r['best_peer']}) | "
              f"{r['optimize_s']:.1f} | {r.get('reoptimize_s', math.nan):.2f} | "
              f"{_subprograms(r['subprograms'])} |")
    print(f"\ngeomean vs best peer {math.exp(sum(logs) / len(logs)):.2f}x over {len(logs)} "
          "models")


if __name__ == "__main__":
    main(sys.argv[1])
