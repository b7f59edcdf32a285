"""``ollie derive FILE`` on bad input files: exit status 2 and one line on stderr naming the
file (and the line and column where there is one), never a traceback (API.md)."""

from __future__ import annotations

import io
import sys

import pytest

from ollie.cli import main
from ollie.commands.derive import MAX_FILE_BYTES

ARGS = ["--max-depth", "0", "--time-budget", "1"]


def _derive(capsys, path: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["derive", path, *ARGS])
    return status, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ollie: error: "), err
    return lines[0]


@pytest.mark.parametrize("data, where, what", [
    (b"A: [2]\nL<i=0:2> A[i] \xff\xfe\n", ":2:15:", "not UTF-8 text (byte 0xff)"),
    ("A: [2]\n# é\nL<i=0:2> A[i] + ".encode() + b"\xc3(", ":3:17:", "not UTF-8 text (byte 0xc3)"),
    (b"", ":1:1:", "expected a declaration"),
    (b"A: [2]\nL<i=0:2> A[i]\x00", ":2:14:", "unexpected character '\\x00'"),
    (b"A: [2]\nL<i=0:2> A[i + 100000000000000000000000000000]", ":2:16:", "too large"),
])
def test_bad_file_contents_exit_2_naming_file_and_position(tmp_path, capsys, data, where, what):
    path = tmp_path / "bad.expr"
    path.write_bytes(data)
    status, err = _derive(capsys, str(path))
    line = _one_line(err)
    assert status == 2
    assert f"{path}{where}" in line and what in line, line


def test_missing_file_directory_and_oversized_file_exit_2(tmp_path, capsys):
    for path, what in [(tmp_path / "missing.expr", "No such file"),
                       (tmp_path, "Is a directory")]:
        status, err = _derive(capsys, str(path))
        assert status == 2 and f"{path}: cannot read: {what}" in _one_line(err)
    big = tmp_path / "big.expr"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    status, err = _derive(capsys, str(big))
    assert status == 2 and f"{big}: cannot read: larger than 16 MiB" in _one_line(err)


def test_byte_order_mark_and_stdin_bytes(tmp_path, capsys, monkeypatch):
    path = tmp_path / "bom.expr"
    path.write_bytes(b"\xef\xbb\xbfA: [2]\nL<i=0:2> A[i] * 2\n")
    status, err = _derive(capsys, str(path))
    assert status == 0, err
    stdin = io.TextIOWrapper(io.BytesIO(b"A: [2]\nL<i=0:2> \xff"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    status, err = _derive(capsys, "-")
    assert status == 2 and "<stdin>:2:10: cannot read: not UTF-8 text" in _one_line(err)


def test_expression_too_large_to_verify_exits_2_naming_file(tmp_path, capsys):
    path = tmp_path / "huge.expr"
    path.write_text("A: [99999999999, 32]\nB: [32, 16]\n"
                    "L<m=0:64, n=0:16> Sum<k=0:32> A[m, k] * B[k, n]\n")
    status, err = _derive(capsys, str(path))
    line = _one_line(err)
    assert status == 2 and f"{path}: making random inputs for 2 tensors" in line, line
