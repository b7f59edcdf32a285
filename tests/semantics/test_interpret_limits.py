"""Interpreter limits: memory and work asked for beyond the limits raise ResourceError before
anything is allocated; huge ranges that are summed without being read, and sampled evaluation
of huge nested scopes, still work. Also defects the text fuzzer found in the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import ollie
from ollie.errors import OllieError, ResourceError
from ollie.semantics import interpret, random_inputs, sample_positions
from ollie.semantics.contract import MAX_OPERANDS, contract
from ollie.semantics.limits import MAX_BYTES, MAX_WORK

A4 = {"A": np.array([1.0, 2.0, 3.0, 4.0], np.float32)}
HUGE = 1 << 40  # a range whose whole-axis array (8 TiB) no machine can allocate


def test_limits_are_documented_constants():
    assert MAX_BYTES == 4 << 30 and MAX_WORK == 1 << 34
    assert issubclass(ResourceError, OllieError) and issubclass(ResourceError, MemoryError)


def test_summing_a_huge_range_the_body_does_not_read_allocates_nothing():
    e = ollie.parse(f"A: [4]\nL<i=0:4> Sum<k=0:{HUGE}> A[i]")
    np.testing.assert_allclose(interpret(e, A4), A4["A"] * float(HUGE), rtol=1e-6)
    np.testing.assert_allclose(interpret(e, A4, at=np.array([[2]])), [3.0 * HUGE], rtol=1e-6)


def test_summing_a_huge_range_the_body_reads_is_refused_as_too_much_work():
    e = ollie.parse(f"A: [4]\nL<i=0:4> Sum<k=0:{HUGE}> A[i] * A[k % 4]")
    for at in (None, np.array([[0]])):
        with pytest.raises(ResourceError, match=r"a term of \{ L<i=0:4> Sum<k=0:1099511627776>"
                                                r".* needs (4\.4|1\.1)e\+12 iteration points"):
            interpret(e, A4, at=at)


def test_max_work_is_a_keyword_and_chunked_evaluation_within_it_works():
    e = ollie.parse("A: [4]\nL<i=0:4> Sum<k=0:20000000> A[i] * A[k % 4]")
    with pytest.raises(ResourceError, match=r"max_work"):
        interpret(e, A4, max_work=1 << 20)
    # 8e7 points: more than one chunk of MAX_ELEMENTS, within the default limit
    np.testing.assert_allclose(interpret(e, A4), A4["A"] * 5e7, rtol=1e-6)


def test_huge_output_is_refused_before_allocating():
    e = ollie.parse("A: [4]\nL<i=0:10000000, j=0:10000000> A[i % 4]")
    with pytest.raises(ResourceError, match=r"the values of \{ L<i=0:10000000, j=0:10000000> "
                                            r"A\[i % 4\] \} \[10000000, 10000000\] needs "
                                            r"7\.45e\+05 GiB .*over the limit of 4\.0 GiB"):
        interpret(e, A4)


def test_huge_nested_scope_is_refused_in_full_but_works_sampled():
    e = ollie.parse("A: [4]\nL<i=0:4> { L<j=0:10000000, k=0:10000000> A[(j + k) % 4] }"
                    "[1000 * i, 3]")
    with pytest.raises(ResourceError, match=r"the values of \{ L<j=0:10000000"):
        interpret(e, A4)
    got = interpret(e, A4, at=np.array([[0], [1], [3]]))
    np.testing.assert_array_equal(got, [A4["A"][3], A4["A"][(1000 + 3) % 4],
                                        A4["A"][(3000 + 3) % 4]])


def test_max_bytes_is_a_keyword():
    e = ollie.parse("A: [4]\nL<i=0:1000, j=0:1000> A[(i + j) % 4]")
    with pytest.raises(ResourceError, match=r"7\.6 MiB.*max_bytes"):
        interpret(e, A4, max_bytes=1 << 20)
    assert interpret(e, A4, max_bytes=None).shape == (1000, 1000)


def test_input_copies_count_against_max_bytes():
    e = ollie.parse("A: [1000, 1000]\nL<i=0:2> A[i, i]")
    with pytest.raises(ResourceError, match=r"input tensor 'A' \[1000, 1000\] as float64"):
        interpret(e, {"A": np.zeros((1000, 1000), np.float32)}, max_bytes=1 << 20)


def test_random_inputs_refuse_huge_declared_tensors():
    e = ollie.parse("A: [100000, 100000, 1000]\nB: [4]\nL<i=0:4> A[i, 0, 0] * B[i]")
    with pytest.raises(ResourceError, match=r"making random inputs for 2 tensors \(the largest, "
                                            r"'A' \[100000, 100000, 1000\], 3\.73e\+04 GiB\) "
                                            r"needs 3\.73e\+04 GiB, over the limit of 4\.0 GiB"):
        random_inputs(e)
    small = ollie.parse("A: [1000, 1000]\nL<i=0:4> A[i, 0]")
    with pytest.raises(ResourceError, match=r"random input 'A' \[1000, 1000\] needs 3\.8 MiB"):
        random_inputs(small, max_bytes=1 << 20)
    assert random_inputs(small)["A"].shape == (1000, 1000)


def test_sample_positions_refuse_huge_samples():
    with pytest.raises(ResourceError, match=r"sampling"):
        sample_positions((1 << 40, 4), 1 << 40)
    assert sample_positions((1 << 40, 4), 5, 0).shape == (5, 2)


def test_derive_refuses_huge_inputs_with_an_ollie_error():
    e = ollie.parse("A: [100000, 100000, 1000]\nL<i=0:4> A[i, 0, 0]")
    with pytest.raises(ResourceError, match=r"random input 'A'"):
        ollie.derive(e, max_depth=1, time_budget=1)


# --------------------------------------------------------------------- found by the fuzzer
def test_product_of_more_factors_than_numpy_einsum_takes():
    # np.einsum takes fewer than 64 operands: 80 equal factors, then 45 over distinct labels
    e = ollie.parse("A: [2]\nL<i=0:2> " + " * ".join(["A[i]"] * 80))
    a = np.array([1.01, -0.99], np.float32)
    np.testing.assert_allclose(interpret(e, {"A": a}), a.astype(np.float64) ** 80, rtol=1e-5)
    rng = np.random.default_rng(0)
    labels = [sorted(rng.choice(6, size=2, replace=False).tolist()) for _ in range(45)]
    ops = [rng.uniform(0.5, 1.5, size=(3, 3)) for _ in labels]
    letters = "abcdef"
    subs = ",".join("".join(letters[x] for x in lab) for lab in labels) + "->ab"
    assert len(ops) > MAX_OPERANDS
    np.testing.assert_allclose(contract(ops, labels, [0, 1]),
                               np.einsum(subs, *ops, optimize="greedy"), rtol=1e-9)


def test_sampled_scope_read_nowhere_in_range_reading_a_nested_scope():
    # sampled evaluation of a nested scope at no position used to crash (a min of no value)
    e = ollie.parse("A: [2]\nL<i=0:4> { L<j=0:8> { L<k=0:8> A[k % 2] }[j] }[i + 10] + A[i % 2]")
    a = {"A": np.array([1.0, 2.0], np.float32)}
    np.testing.assert_array_equal(interpret(e, a), [1.0, 2.0, 1.0, 2.0])
    np.testing.assert_array_equal(interpret(e, a, at=np.array([[1], [3]])), [2.0, 2.0])
