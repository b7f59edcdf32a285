"""The JSON form of kernel parameters and graph operators (ollie.program.serialize): every
value of the closed set round-trips exactly; any other JSON document either decodes to such
a value or raises FormatError (an OllieError), never anything else."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ollie.errors import OllieError
from ollie.graph.opaque import OpRef, TensorRef
from ollie.program.serialize import FormatError, decode, encode, kernel_from_json

_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**62, 2**62), st.text(max_size=8),
    st.floats(allow_nan=False), st.just(float("inf")), st.just(float("-inf")),
    st.integers(0, 5).map(TensorRef),
    st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16]),
    st.sampled_from([torch.contiguous_format, torch.channels_last]),
    st.sampled_from([torch.device("cpu"), torch.device("cuda:1")]),
    st.just(OpRef("aten", "add", "Tensor")),
    st.builds(slice, st.none() | st.integers(-5, 5), st.none() | st.integers(-5, 5),
              st.none() | st.integers(1, 3)),
    st.just(Ellipsis),
)
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=12)


@given(_VALUES)
def test_values_round_trip(value):
    doc = encode(value, "test")
    text = json.dumps(doc, allow_nan=False)  # plain JSON: no NaN / Infinity literals
    assert decode(json.loads(text), "test") == value


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from(["$tuple", "$op", "$ref", "$array", "$onnx", "$dtype", "$callable"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["$tuple", "$dict", "$slice", "$ref", "$op", "$callable", "$dtype",
                         "$device", "$array", "$onnx", "$float", "$memory_format", "kind",
                         "node", "expr", "inputs", "output", "params", "shape", "views"])
        | st.text(max_size=4), inner, max_size=3), max_leaves=10)


@given(_JSON)
def test_arbitrary_documents_decode_or_raise_format_error(doc):
    """Anything but FormatError (an OllieError) escaping here fails the test."""
    with contextlib.suppress(FormatError):
        decode(doc, "fuzz")
    with contextlib.suppress(OllieError):
        kernel_from_json(doc, "fuzz")


@pytest.mark.parametrize("doc", [
    {"$op": "os::system.default"}, {"$op": "aten::no_such_op.default"},
    {"$callable": "builtins.exec"}, {"$dtype": "load"}, {"$device": "http://x"},
    {"$array": {"dtype": "object", "shape": [1], "data": ""}},
    {"$array": {"dtype": "float32", "shape": [4], "data": "AAAA"}},
    {"$onnx": "not base64!"}, {"$pickle": ""}, {"a": 1, "b": 2},
])
def test_unknown_or_unsafe_values_are_refused(doc):
    with pytest.raises(FormatError):
        decode(doc, "test")


def test_arrays_round_trip_and_stay_small():
    import numpy as np

    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    back = decode(json.loads(json.dumps(encode(a, "t"))), "t")
    assert back.dtype == a.dtype and (back == a).all()
    with pytest.raises(FormatError, match="inline array"):
        encode(np.zeros(1 << 19, np.float32), "t")


def test_ollies_own_operators_resolve():
    """The zoo's band operators (torch.ops.ollie.*) are registered on first use."""
    op = decode({"$op": "ollie::g2bmm.default"}, "test")
    assert isinstance(op, OpRef) and callable(op.resolve())
