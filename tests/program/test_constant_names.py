"""Program.save / Program.load keep every constant, whatever its name: names that are also
parameters of ``numpy.savez`` (``file``, ``allow_pickle``) included (``savez`` takes the arrays
as keyword arguments, so it failed on the first and took the second as its own option)."""

from __future__ import annotations

import numpy as np
import pytest

from ollie.ir import parse
from ollie.match.eop import make_eop
from ollie.program.program import Program


@pytest.mark.parametrize("name", ["file", "allow_pickle", "W", "arr_0"])
def test_constant_named_like_a_savez_parameter_round_trips(tmp_path, name):
    expr = parse(f"A: [4]\n{name}: [4]\nL<i=0:4> A[i] + {name}[i]")
    kernel = make_eop(expr.root, {"A": (4,), name: (4,)}, "Y")
    value = np.arange(4, dtype=np.float32)
    prog = Program((("A", (4,)),), ("Y",), [kernel], {name: value})
    prog.save(tmp_path / "p")
    again = Program.load(tmp_path / "p")
    assert set(again.constants) == {name}
    np.testing.assert_array_equal(again.constants[name], value)
    assert again.constants[name].dtype == np.float32
