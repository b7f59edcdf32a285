"""Generated kernels compiled once per pattern (``ollie.codegen.pattern``): expressions equal up
to the sizes of their outer loops share one compiled function and each computes what the
interpreter computes; sizes that stay literal (inner extents) keep kernels apart; the exact
division by a magic multiplication."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie.codegen import cpu
from ollie.codegen.cpu import analyse_plan, compile_cpu, generate_source
from ollie.codegen.emit import emit_module
from ollie.codegen.nests import NEST_DIR, split_module
from ollie.codegen.pattern import MAX_ITEMS, magic, parametrise, parametrise_module
from ollie.codegen.plan import make_plan
from ollie.codegen.residue import split_residues
from ollie.testing.kernels import assert_agrees, nest_functions


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """No kernel or nest module of another test in this process."""
    monkeypatch.setattr(cpu, "_KERNELS", {})
    for name in [m for m in sys.modules if m.startswith("ollie_kernels.")]:
        monkeypatch.delitem(sys.modules, name)



def _compiles(functions) -> int:
    """numba compilations and cache loads of ``functions`` (each counts one per signature)."""
    return sum(sum(f.stats.cache_hits.values()) + sum(f.stats.cache_misses.values())
               for f in functions)


BIAS_RELU = "A: [{n}, {c}, 6, {w}]\nB: [{c}]\nL<n=0:{n}, c=0:{c}, h=0:6, w=0:{w}> " \
            "relu(A[n, c, h, w] + B[c])"
OFFSET_ADD = "A: [{n}, {c}, 12, 12]\nL<n=0:{n}, c=0:{c}, h=0:12, w=0:12> " \
             "Sum<r=0:3, s=0:3> A[n, c, h + r - 1, w + s - 1]"
"""Sizes ``n`` and ``c`` are those of the fused outer loops (taken out); ``w`` is the inner
traversal extent (kept literal)."""


@pytest.mark.parametrize(("template", "first", "second"), [
    (BIAS_RELU, {"n": 2, "c": 16, "w": 7}, {"n": 3, "c": 8, "w": 7}),  # serial, nested loops
    (OFFSET_ADD, {"n": 1, "c": 2048, "w": 0}, {"n": 2, "c": 1536, "w": 0}),  # prange
])
def test_expressions_equal_up_to_outer_sizes_share_one_compiled_function(tmp_path, template,
                                                                          first, second):
    e1, e2 = (ollie.parse(template.format(**sizes)) for sizes in (first, second))
    k1, k2 = compile_cpu(e1, cache_dir=tmp_path), compile_cpu(e2, cache_dir=tmp_path)
    assert k1.path != k2.path  # two kernel modules (their sizes) ...
    assert nest_functions(k1) == nest_functions(k2)  # ... one function, compiled once
    assert _compiles(nest_functions(k1)) == 1
    assert len(list((tmp_path / NEST_DIR).glob("nest_*.py"))) == 1
    parallel = "prange(" in k1.source
    assert parallel == (template == OFFSET_ADD)
    assert_agrees(k1, e1, 0)
    assert_agrees(k2, e2, 1)


def test_kernels_whose_inner_extent_differs_do_not_share(tmp_path):
    e1, e2 = (ollie.parse(BIAS_RELU.format(n=2, c=16, w=w)) for w in (7, 9))
    k1, k2 = compile_cpu(e1, cache_dir=tmp_path), compile_cpu(e2, cache_dir=tmp_path)
    assert set(nest_functions(k1)).isdisjoint(nest_functions(k2))
    assert len(list((tmp_path / NEST_DIR).glob("nest_*.py"))) == 2
    assert "range(0, 7)" in k1.source and "range(0, 9)" in k2.source
    assert_agrees(k1, e1, 2)
    assert_agrees(k2, e2, 3)


def test_a_window_that_differs_keeps_kernels_apart():
    """A 3x3 and a 5x5 window (literal summation loops) give different nest texts."""
    texts = []
    for k in (3, 5):
        expr = ollie.parse(f"A: [1, 64, 12, 12]\nL<n=0:1, c=0:64, h=0:12, w=0:12> "
                           f"Sum<r=0:{k}, s=0:{k}> A[n, c, h + r - {k // 2}, w + s - {k // 2}]")
        split = split_module(generate_source(expr))
        assert split is not None
        texts.append(sorted(split.nests.values()))
    assert texts[0] != texts[1]


def test_the_literal_form_is_recovered_by_substituting_the_values():
    """A parametrised function with its ``_szK`` replaced by their values, the sizes parameter
    and its loads dropped, is the function it was made from (a serial nest in nested loops:
    no division rewritten)."""
    expr = ollie.parse(BIAS_RELU.format(n=2, c=16, w=7))
    plan = split_residues(make_plan(expr))
    module = emit_module(plan, analyse_plan(plan), {"text": "", "CANONICAL": ""}, nested=True)
    text = module[module.index("@njit"):module.index("\n\n\ndef run")]
    assert "for _p0 in range(2):" in text
    new, values = parametrise(text)
    assert values and "sz" in new.splitlines()[1] and ">>" not in new
    back = "\n".join(ln for ln in new.splitlines() if " = sz[" not in ln)
    for k in reversed(range(len(values))):
        back = back.replace(f"_sz{k}", str(values[k]))
    assert back.replace(", int64[::1])", ")").replace(", sz)", ")") == text


def test_a_module_passes_each_function_its_sizes():
    expr = ollie.parse(OFFSET_ADD.format(n=1, c=2048))
    literal = generate_source(expr, literal_sizes=True)
    text = parametrise_module(literal)
    assert "SIZES_nest_0 = np.array([" in text and "nest_0(in_0, out, SIZES_nest_0)" in text
    assert "def nest_0(in_0, out, sz):" in text
    assert parametrise_module("x = 1\n\n\ndef run(out):\n    return 2\n") == \
        "x = 1\n\n\ndef run(out):\n    return 2\n"  # no njit function: unchanged


@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_ITEMS), st.integers(0, MAX_ITEMS - 1))
def test_magic_division_is_exact_below_max_items(d, p):
    m, s = magic(d)
    assert p * m < 2**63 and (p * m) >> s == p // d


@pytest.mark.parametrize("d", [1, 2, 3, 7, 56, 768, 3136, 2**31 - 1, 2**31])
def test_magic_division_is_exact_at_the_edges(d):
    m, s = magic(d)
    for p in (0, 1, d - 1, d, d + 1, MAX_ITEMS - 1, (MAX_ITEMS - 1) // d * d,
              (MAX_ITEMS - 1) // d * d - 1):
        if 0 <= p < MAX_ITEMS:
            assert p * m < 2**63 and (p * m) >> s == p // d, (d, p)
    with pytest.raises(ValueError):
        magic(0)
