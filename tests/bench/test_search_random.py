"""``ollie bench search --random-shapes``: one search per random shape, a line per family."""

import json

from ollie.cli import EXIT_BAD_INPUT, main
from ollie.testing.clock import stopped_clock


def test_random_shapes_table(tmp_path, ollie_settings, capsys):
    ollie_settings(search_clock=stopped_clock)  # the search ends at its depth, not its budget
    argv = ["bench", "search", "--random-shapes", "2", "--cases", "matmul_transposed", "gbmm",
            "--depths", "1-2", "--budget", "5", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "search_random.json").read_text())
    assert [r["family"] for r in rows] == ["matmul_transposed"] * 2 + ["gbmm"] * 2
    assert all(r["found"] and r["reported"] for r in rows)
    table = (tmp_path / "search_random.md").read_text().splitlines()
    assert table[0].startswith("# Search on random shapes") and "depth 2" in table[0]
    bound = sum(r["compute_bound"] for r in rows[:2])
    share = f"{bound}/{bound} (100%)" if bound else "0/0"
    assert f"| matmul_transposed | 2/2 (100%) | {share} | 2/2 (100%) |" in "\n".join(table)
    # the same shapes again with the same seed
    assert main(argv) == 0
    assert [r["sizes"] for r in json.loads((tmp_path / "search_random.json").read_text())] == \
        [r["sizes"] for r in rows]
    capsys.readouterr()
    assert main(["bench", "search", "--random-shapes", "1", "--cases", "nope",
                 "--out", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "no random shapes for nope" in capsys.readouterr().err
