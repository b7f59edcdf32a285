"""Bad call-time inputs to an optimised program (issue: safe to run).

``prog = ollie.optimize(model, (x,))`` is called with inputs of the wrong number, shape,
dtype, device or kind (None, a list, a meta tensor, a numpy array), with non-contiguous and
channels-last tensors, and with NaN / infinity in its inputs. Each call either raises a
:class:`ollie.ShapeError` naming the input, what the program expected and what it got, or
returns what the model returns (NaN and infinities where the model puts them). A
floating-point input of another dtype (float64, float16, bfloat16; a float64 numpy array) is
computed in float32: the model's output for it converted to float32. Integer, boolean and
complex inputs are refused.

The programs: a small CNN optimised with the library choice on (on this CPU, usually one
ONNX Runtime region called through its fast path) and off (every kernel run by the executor),
and a model with two inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fuzz_util import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import ollie
from ollie.testing.programs import TwoInputs

SHAPE = (2, 3, 6, 6)
SETTINGS = dict(device="cpu", time_budget=0.5, max_depth=1, max_candidates=2, use_cache=False,
                context=False, settle=0.0)
RTOL = 1e-3


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 5, 1), nn.Tanh(), nn.Flatten(), nn.Linear(45, 3),
                         nn.Sigmoid()).eval()


@pytest.fixture(scope="module", params=["libraries", "executor"])
def program(request: pytest.FixtureRequest) -> tuple[nn.Module, ollie.OptimizedModel]:
    """(model, program): the CNN optimised with the library choice on or off."""
    model = cnn()
    prog = ollie.optimize(model, (torch.randn(SHAPE),), **SETTINGS,
                          choose_libraries=request.param == "libraries")
    return model, prog


@pytest.fixture(scope="module")
def two_inputs() -> tuple[nn.Module, ollie.OptimizedModel]:
    model = TwoInputs(seed=1).eval()
    x = torch.randn(1, 3, 5, 5)
    return model, ollie.optimize(model, (x, x), **SETTINGS)


def eager(model: nn.Module, *xs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(*xs)


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` matches ``want``: NaN at the same positions, the same infinities, the finite
    values within :data:`RTOL` of the largest finite magnitude."""
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert got.shape == want.shape
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN at other positions"
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf), "infinities at other positions"
    assert torch.equal(got[inf], want[inf]), "infinities of other signs"
    fin = torch.isfinite(want)
    if fin.any():
        scale = want[fin].abs().max().clamp_min(1e-6)
        err = float((got[fin] - want[fin]).abs().max() / scale)
        assert err < RTOL, err


def assert_refused(prog: ollie.OptimizedModel, *args: object, says: tuple[str, ...]) -> str:
    """``prog(*args)`` raises a ShapeError whose message contains every one of ``says``."""
    with pytest.raises(ollie.ShapeError) as info:
        prog(*args)
    msg = str(info.value)
    for word in says:
        assert word in msg, (word, msg)
    return msg


# ----------------------------------------------------------------------------- refused
def test_wrong_number_of_inputs(program, two_inputs) -> None:
    _, prog = program
    x = torch.randn(SHAPE)
    assert_refused(prog, says=("takes 1 input", "got 0"))
    assert_refused(prog, x, x, says=("takes 1 input", "got 2"))
    _, prog2 = two_inputs
    assert_refused(prog2, torch.randn(1, 3, 5, 5), says=("takes 2 input", "got 1"))


@pytest.mark.parametrize("bad", [(2, 3, 6, 7), (1, 3, 6, 6), (3, 6, 6), (2, 3, 6, 6, 1)])
def test_wrong_shape_names_input_and_shapes(program, bad) -> None:
    _, prog = program
    name = prog.input_names[0]
    assert_refused(prog, torch.randn(bad), says=(f"'{name}'", str(list(bad)), str(list(SHAPE))))


def test_wrong_shape_of_the_second_input(two_inputs) -> None:
    _, prog = two_inputs
    a = torch.randn(1, 3, 5, 5)
    msg = assert_refused(prog, a, torch.randn(1, 3, 5, 4), says=("[1, 3, 5, 4]", "[1, 3, 5, 5]"))
    assert f"'{prog.input_names[1]}'" in msg


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_non_floating_dtype_names_dtype(program, dtype) -> None:
    _, prog = program
    x = torch.randn(SHAPE).to(dtype)
    assert_refused(prog, x, says=(str(dtype), "float32", f"'{prog.input_names[0]}'"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_floating_dtypes_are_converted_to_float32(program, dtype) -> None:
    model, prog = program
    x = torch.randn(SHAPE).to(dtype)
    assert_same(prog(x), eager(model, x.float()))


@pytest.mark.parametrize("value", [None, [1.0, 2.0], 3.0, "x"])
def test_not_a_tensor(program, value) -> None:
    _, prog = program
    assert_refused(prog, value, says=(f"'{prog.input_names[0]}'", "expected a float32 tensor"))


def test_meta_tensor(program) -> None:
    _, prog = program
    assert_refused(prog, torch.empty(SHAPE, device="meta"), says=("meta", "no data"))


def test_numpy_arrays(program) -> None:
    model, prog = program
    x = np.random.default_rng(0).standard_normal(SHAPE)  # float64: converted
    assert_same(prog(x), eager(model, torch.from_numpy(x).float()))
    assert_refused(prog, x.astype(np.int64), says=("int64", "floating-point"))


@pytest.mark.gpu
def test_tensor_on_another_device(program) -> None:
    _, prog = program
    assert_refused(prog, torch.randn(SHAPE, device="cuda"), says=("cuda", "cpu", ".to("))


@pytest.mark.gpu
def test_cuda_program_refuses_cpu_tensor() -> None:
    model = cnn().cuda()
    x = torch.randn(SHAPE, device="cuda")
    prog = ollie.optimize(model, (x,), **{**SETTINGS, "device": "cuda"})
    assert_same(prog(x), eager(model, x))
    assert_refused(prog, x.cpu(), says=("cpu", "cuda", ".to("))


# ----------------------------------------------------------------------------- accepted
LAYOUTS = {
    "contiguous": lambda x: x,
    "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
    "transposed": lambda x: x.transpose(2, 3).contiguous().transpose(2, 3),
    "sliced": lambda x: torch.cat([x, x], 0)[SHAPE[0]:],
    "strided": lambda x: torch.stack([x, x], -1)[..., 1],
    "expanded": lambda x: x[:1].expand(SHAPE),
    "requires_grad": lambda x: x.clone().requires_grad_(),
    "parameter": lambda x: nn.Parameter(x.clone()),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_give_the_models_output(program, layout) -> None:
    model, prog = program
    x = LAYOUTS[layout](torch.randn(SHAPE))
    assert_same(prog(x), eager(model, x))


def test_numpy_float32_array(program) -> None:
    model, prog = program
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    assert_same(prog(x), eager(model, torch.from_numpy(x)))


def test_two_inputs_channels_last_and_view(two_inputs) -> None:
    model, prog = two_inputs
    a = torch.randn(1, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    b = torch.randn(1, 3, 5, 5).transpose(2, 3)
    assert_same(prog(a, b), eager(model, a, b))


def test_the_inputs_are_not_modified(program) -> None:
    _, prog = program
    x = torch.randn(SHAPE)
    before = x.clone()
    prog(x)
    assert torch.equal(x, before)


# ----------------------------------------------------------------------------- NaN / inf
SPECIAL = st.sampled_from([float("nan"), float("inf"), -float("inf")])


@st.composite
def special_inputs(draw: st.DrawFn, shape: tuple[int, ...] = SHAPE) -> torch.Tensor:
    """A standard normal tensor with a few entries NaN, +inf or -inf."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    flat = x.view(-1)
    for _ in range(draw(st.integers(1, 4))):
        flat[draw(st.integers(0, flat.numel() - 1))] = draw(SPECIAL)
    return x


@fuzz_settings(10)
@given(x=special_inputs())
def test_nan_and_inf_propagate_as_in_the_model(program, x) -> None:
    model, prog = program
    assert_same(prog(x), eager(model, x))


@fuzz_settings(10)
@given(a=special_inputs((1, 3, 5, 5)), b=special_inputs((1, 3, 5, 5)))
def test_nan_and_inf_propagate_with_two_inputs(two_inputs, a, b) -> None:
    model, prog = two_inputs
    assert_same(prog(a, b), eager(model, a, b))


# ----------------------------------------------------------------------------- fuzzed
DTYPES = [torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int64, torch.bool]


@st.composite
def call_inputs(draw: st.DrawFn) -> tuple[torch.Tensor, bool]:
    """(an input, whether the program must accept it): a shape near :data:`SHAPE`, a dtype,
    a layout, and values possibly with NaN / infinity."""
    shape = list(SHAPE)
    change = draw(st.sampled_from(["none", "none", "dim", "rank"]))
    if change == "dim":
        k = draw(st.integers(0, len(shape) - 1))
        shape[k] = draw(st.integers(1, 8).filter(lambda v, k=k: v != SHAPE[k]))
    elif change == "rank":
        shape = shape[:-1] if draw(st.booleans()) else [*shape, 1]
    x = draw(special_inputs(tuple(shape))) if draw(st.booleans()) else \
        torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 9))))
    dtype = draw(st.sampled_from(DTYPES))
    x = x.to(dtype) if dtype.is_floating_point else torch.nan_to_num(x).round().to(dtype)
    if tuple(shape) == SHAPE and dtype.is_floating_point:
        x = LAYOUTS[draw(st.sampled_from(sorted(LAYOUTS)))](x)
    return x, tuple(shape) == SHAPE and dtype.is_floating_point


@fuzz_settings(25)
@given(case=call_inputs())
def test_fuzzed_call_inputs(program, case) -> None:
    model, prog = program
    x, accepted = case
    if accepted:  # a floating-point input: computed in float32
        assert_same(prog(x), eager(model, x.float()))
    else:
        with pytest.raises(ollie.ShapeError, match=prog.input_names[0]):
            prog(x)
