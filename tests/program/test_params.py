"""Typed kernel kinds and parameters: the enum compares as API.md's strings, a parameter
object reads as the mapping of API.md, and a plain mapping is converted when a kernel is built."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import ollie
from ollie.errors import UnsupportedError
from ollie.program.kernel import Kernel
from ollie.program.params import (
    ConvParams,
    EOpParams,
    KernelKind,
    MatmulParams,
    ParamsError,
    make_params,
)
from ollie.program.serialize import FormatError, kernel_from_json, kernel_to_json

E = ollie.parse("A: [2, 3]\nB: [3, 4]\nL<i=0:2, j=0:4> Sum<k=0:3> A[i, k] * B[k, j]")


def test_kinds_are_the_strings_of_the_api():
    assert KernelKind.MATMUL == "Matmul" and str(KernelKind.EOP) == "eOp"
    assert json.dumps({"kind": KernelKind.CONV}) == '{"kind": "Conv"}'
    assert {k.value for k in KernelKind} >= {"Matmul", "Conv", "G2BMM", "GBMM", "eOp"}


def test_a_kernel_built_from_strings_gets_the_enum_and_typed_parameters():
    k = Kernel("Matmul", {"b": 1, "m": 2, "n": 4, "k": 3, "trans_a": False,
                          "trans_b": False, "alpha": 1.0}, ("A", "B"), "y", E)
    assert k.kind is KernelKind.MATMUL and k.kind == "Matmul"
    assert isinstance(k.params, MatmulParams) and k.params.m == 2
    assert k.params["m"] == 2 and k.params.get("activation") is None
    assert "activation" not in k.params and "region" not in k.params
    assert dict(k.params) == {"b": 1, "m": 2, "n": 4, "k": 3, "trans_a": False,
                              "trans_b": False, "alpha": 1.0}
    assert k.to_json() == {"kind": "Matmul", "params": dict(k.params)}


def test_annotations_and_unknown_parameters_are_kept_in_order():
    p = make_params("Matmul", {"b": 1, "m": 2, "n": 4, "k": 3, "note": "x"})
    q = replace(p, library="oneDNN packed", region=0)
    assert list(q) == ["b", "m", "n", "k", "trans_a", "trans_b", "alpha", "library", "region",
                       "note"]
    assert q["note"] == "x" and q == {**p, "library": "oneDNN packed", "region": 0}
    assert replace(q, region=None) == {**p, "library": "oneDNN packed"}


def test_missing_parameters_and_unknown_kinds_are_refused():
    with pytest.raises(ParamsError, match=r"Conv.*n, c, h"):
        Kernel("Conv", {}, ("A",), "y", E)
    with pytest.raises(UnsupportedError, match="Pool"):
        Kernel("Pool", {}, ("A",), "y", E)
    assert isinstance(make_params(KernelKind.EOP, {}), EOpParams)


def test_json_round_trip_and_a_document_missing_a_parameter():
    conv = ConvParams(n=1, c=3, h=4, w=4, f=2, r=1, s=1, ph=0, pw=0, sh=1, sw=1, dh=1, dw=1)
    e = ollie.parse("A: [1, 3, 4, 4]\nW: [2, 3, 1, 1]\nL<n=0:1, f=0:2, h=0:4, w=0:4> "
                    "Sum<c=0:3> A[n, c, h, w] * W[f, c, 0, 0]")
    k = Kernel(KernelKind.CONV, replace(conv, activation="relu"), ("A", "W"), "y", e)
    doc = json.loads(json.dumps(kernel_to_json(k)))
    back = kernel_from_json(doc)
    assert back.params == k.params and isinstance(back.params, ConvParams)
    del doc["params"]["dh"]
    with pytest.raises(FormatError, match="dh"):
        kernel_from_json(doc)
