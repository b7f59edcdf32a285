"""``ollie derive FILE`` on an expression program file: normalisation, one step of the
inter-expression rules (listed by rule name), the best-looking program chosen and each of its
defs derived; ``--json`` gives a ``defs`` list. Single-expression files keep their output."""

from __future__ import annotations

import json

from ollie.cli import main
from ollie.commands.derive import best_looking, def_budgets, summed_points
from ollie.ir import parse_program

QKV = """\
x: [1, 4, 8]
Wq: [8, 8]
Wk: [8, 8]
Wv: [8, 8]
bq: [8]
Q = L<b=0:1, s=0:4, n=0:8> Sum<k=0:8> x[b, s, k] * Wq[k, n]
K = L<b=0:1, s=0:4, n=0:8> Sum<k=0:8> x[b, s, k] * Wk[k, n]
V = L<b=0:1, s=0:4, n=0:8> Sum<k=0:8> x[b, s, k] * Wv[k, n]
Qb = L<b=0:1, s=0:4, n=0:8> Q[b, s, n] + bq[n]
out Qb, K, V
"""
ARGS = ["--max-depth", "1", "--time-budget", "2"]


def _derive(tmp_path, capsys, text, *extra):
    path = tmp_path / "qkv.prog"
    path.write_text(text)
    capsys.readouterr()
    status = main(["derive", str(path), *ARGS, *extra])
    out, err = capsys.readouterr()
    return status, out, err, path


def test_program_file_lists_rules_and_derives_each_def_of_the_merged_program(tmp_path, capsys):
    status, out, err, _ = _derive(tmp_path, capsys, QKV, "--explain")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "program: 5 inputs, 4 defs (4 after normalisation), outputs Qb, K, V"
    assert any("expression_merging: merge Q, K, V into Q_K_V (stack, g_at=inner)" in ln
               for ln in lines)
    assert any("expression_fusion: inline Q into Qb" in ln for ln in lines)
    assert any("expression_splitting: split" in ln for ln in lines)
    chosen = next(ln for ln in lines if ln.startswith("chosen: #"))
    assert "(expression_merging)" in chosen
    derived = [ln.split(":")[0] for ln in lines if ln.startswith("def ")]
    assert derived == ["def Q_K_V", "def K", "def V", "def Qb"]
    assert sum(ln.strip().startswith("best: ") for ln in lines) == 4
    assert sum(ln.startswith("candidate 0: ") for ln in lines) == 4  # --explain, per def


def test_program_file_json_has_a_defs_list(tmp_path, capsys):
    status, out, err, _ = _derive(tmp_path, capsys, QKV, "--json")
    assert status == 0, err
    obj = json.loads(out)
    assert obj["chosen"]["derivation"] == ["expression_merging"]
    assert parse_program(obj["chosen"]["program"]).outputs == ("Qb", "K", "V")
    assert [d["name"] for d in obj["defs"]] == ["Q_K_V", "K", "V", "Qb"]
    for d in obj["defs"]:
        assert set(d) == {"name", "expr", "time_budget", "stats", "candidates"}
        assert d["candidates"] and all(c["verified"] for c in d["candidates"])
    assert abs(sum(d["time_budget"] for d in obj["defs"]) - 2.0) < 1e-9
    assert {d["rule"] for d in obj["derived"]} == {"expression_fusion", "expression_merging",
                                                   "expression_splitting"}


def test_single_expression_json_is_unchanged(tmp_path, capsys):
    status, out, err, _ = _derive(tmp_path, capsys,
                                  "A: [4, 3]\nB: [3, 2]\nL<m=0:4, n=0:2> Sum<k=0:3> "
                                  "A[m, k] * B[k, n]\n", "--json")
    assert status == 0, err
    assert set(json.loads(out)) == {"stats", "candidates"}


def test_bad_program_file_exits_2_naming_file_and_position(tmp_path, capsys):
    status, _, err, path = _derive(tmp_path, capsys, QKV.replace("out Qb, K, V", "out Qb, x"))
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{path}:10:9: output 'x' is an input" in lines[0], err


def test_best_looking_prefers_fewest_summing_defs_and_budgets_sum_to_the_total():
    ep = parse_program(QKV)
    one = parse_program("x: [1, 4, 8]\nY = L<b=0:1, s=0:4, n=0:8> Sum<k=0:8> x[b, s, k]\n"
                        "Z = L<b=0:1, s=0:4, n=0:8> Y[b, s, n] * 2\nout Z\n")
    assert best_looking([ep, one]) == 1 and best_looking([ep, ep]) == 0
    # inlining a Matmul into two readers computes it twice: not chosen over fewer defs
    twice = parse_program("x: [4, 8]\nW: [8, 8]\n"
                          "Z1 = L<m=0:4, n=0:8> { L<m=0:4, n=0:8> Sum<k=0:8> x[m, k] * W[k, n] "
                          "}[m, n] * 2\n"
                          "Z2 = L<m=0:4, n=0:8> { L<m=0:4, n=0:8> Sum<k=0:8> x[m, k] * W[k, n] "
                          "}[m, n] + 1\nout Z1, Z2\n")
    once = parse_program("x: [4, 8]\nW: [8, 8]\n"
                         "Y = L<m=0:4, n=0:8> Sum<k=0:8> x[m, k] * W[k, n]\n"
                         "Z1 = L<m=0:4, n=0:8> Y[m, n] * 2\nZ2 = L<m=0:4, n=0:8> Y[m, n] + 1\n"
                         "out Z1, Z2\n")
    assert summed_points(dict(twice.defs)["Z1"].root) == 4 * 8 * 8
    assert best_looking([once, twice]) == 0
    shares = def_budgets(ep, 10.0)
    assert abs(sum(shares) - 10.0) < 1e-9
    assert shares[0] > shares[3] > 0  # the Matmul Q over the bias add Qb
