"""The package layout's rules, checked by parsing ``src/ollie`` with ``ast`` (nothing is
imported): no import cycle between top-level packages (function-local imports count), no
import of another module's private name, no module over :data:`MAX_LINES` lines, no date in a
docstring or comment. Why these rules and which way data flows:
docs/design/018-package-layout.md."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ollie"
MAX_LINES = 500
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``src/ollie``."""
    out = {}
    for f in sorted(SRC.rglob("*.py")):
        parts = f.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _package(module: str) -> str:
    """The top-level package (or top-level module) of ``module``: ``ollie.exec.conv`` ->
    ``exec``; ``ollie`` itself (the facade of the public names) -> ``ollie``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(module: str, path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, imported module, names)`` of every import of an ``ollie`` module in ``path``,
    function-local ones included; ``from pkg import sub`` of a submodule counts as an import
    of the submodule."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ollie"):
                continue
            plain = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:
                    out.append((node.lineno, sub, []))
                else:
                    plain.append(alias.name)
            if plain:
                out.append((node.lineno, target, plain))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, []) for a in node.names
                       if a.name.startswith("ollie"))
    return out


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for _, target, _ in _imports(module, path):
            a, b = _package(module), _package(target)
            if a != b:
                edges[a].add(b)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_top_level_packages():
    edges = _edges()
    cycles = _cycles(edges)
    detail = [f"{a} -> {sorted(edges[a] & set(c))}" for c in cycles for a in c]
    assert not cycles, f"package cycles {cycles}: {detail}"


def test_the_executor_sits_above_what_it_runs():
    """Data flows down the layout (docs/design/018-package-layout.md): the layers below the
    executor never import it, and the program data never imports what rewrites or runs it."""
    edges = _edges()
    for low in ("ir", "semantics", "program", "tune", "codegen", "kernels", "libs",
                "backends"):
        assert "exec" not in edges.get(low, set()), f"{low} imports exec"
    for high in ("passes", "exec", "optimizer", "search", "match", "codegen", "tune"):
        assert high not in edges.get("program", set()), f"program imports {high}"
    assert not {"kernels", "backends", "exec"} & edges.get("libs", set())
    assert not {"backends", "exec"} & edges.get("kernels", set())


def test_no_private_name_imported_across_modules():
    bad = []
    for module, path in MODULES.items():
        for line, target, names in _imports(module, path):
            bad += [f"{path.relative_to(SRC.parent)}:{line} {target}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__")]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(SRC.parent)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _dated(path: Path) -> list[str]:
    text = path.read_text()
    hits = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str) and DATE.search(node.value.value):
            hits.append(f"{path.relative_to(SRC.parent)}:{node.lineno} (docstring)")
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and DATE.search(tok.string):
            hits.append(f"{path.relative_to(SRC.parent)}:{tok.start[0]} (comment)")
    return hits


def test_no_date_in_docstrings_or_comments():
    hits = [h for p in MODULES.values() for h in _dated(p)]
    assert not hits, "dates belong in docs/design/ notes:\n" + "\n".join(hits)


@pytest.mark.parametrize("gone", ["runtime", "program/postprocess.py", "program/orient.py"])
def test_moved_modules_are_gone(gone):
    """``ollie.runtime`` was split into exec / kernels / libs / backends, the program rewrites
    moved to ``ollie.passes`` (an emptied folder, or one holding only bytecode, may remain in a
    working copy)."""
    path = SRC / gone
    assert not (path.is_file() or (path.is_dir() and any(path.rglob("*.py"))))
