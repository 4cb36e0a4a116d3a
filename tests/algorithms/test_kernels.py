"""The shared flat-vector kernels in fedsim.algorithms._kernels."""

from __future__ import annotations

import math

import pytest
import torch

from fedsim.algorithms import (
    NonFiniteUpdate,
    check_finite,
    flatten,
    lerp,
    norm64,
    unflatten,
)


def test_flatten_unflatten_round_trip():
    tensors = [torch.arange(6.0).view(2, 3), torch.tensor(7.0), torch.ones(4)]
    vec = flatten(tensors)
    assert vec.dtype == torch.float32
    assert vec.shape == (11,)
    parts = unflatten(vec, [(2, 3), (), (4,)])
    for got, want in zip(parts, tensors, strict=True):
        assert torch.equal(got, want)
    # unflatten returns views of the vector, flatten a copy of the tensors.
    parts[0][0, 0] = 100.0
    assert vec[0] == 100.0
    assert tensors[0][0, 0] == 0.0


def test_flatten_casts_and_handles_empty():
    assert flatten([torch.ones(2, dtype=torch.float64)]).dtype == torch.float32
    empty = flatten([])
    assert empty.shape == (0,)
    assert empty.dtype == torch.float32


def test_unflatten_rejects_too_long_vector():
    with pytest.raises(ValueError, match=r"Invalid vector length 7.*need 6"):
        unflatten(torch.zeros(7), [(2, 3)])


def test_unflatten_rejects_too_short_vector():
    with pytest.raises(ValueError, match=r"Invalid vector length 5.*need 6"):
        unflatten(torch.zeros(5), [(2, 3)])


def test_norm64_is_the_whole_vector_norm_in_float64():
    vec = torch.tensor([3e20, 4e20], dtype=torch.float32)  # squares overflow float32
    assert norm64(vec) == pytest.approx(5e20, rel=1e-6)
    parts = [torch.tensor([3.0]), torch.tensor([4.0])]
    # ||v|| of the concatenation, not the sum of per-tensor norms.
    assert norm64(flatten(parts)) == 5.0
    assert math.isclose(norm64(torch.zeros(0)), 0.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_check_finite_counts_bad_values(bad):
    vec = torch.tensor([1.0, bad, bad, 2.0])
    with pytest.raises(NonFiniteUpdate, match=r"Invalid update: 2 non-finite"):
        check_finite(vec)
    with pytest.raises(NonFiniteUpdate, match=r"Invalid model: 2 non-finite"):
        check_finite(vec, "model")
    check_finite(torch.tensor([1.0, -3.0]))


def test_lerp_is_a_new_tensor():
    x, y = torch.zeros(3), torch.ones(3)
    out = lerp(x, y, 0.25)
    assert torch.allclose(out, torch.full((3,), 0.25))
    assert torch.equal(x, torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_all_finite_finds_one_bad_value_in_any_layout(dtype, bad):
    from fedsim.algorithms._kernels import all_finite

    vec = torch.linspace(-3.0, 3.0, 1000).to(dtype)
    assert all_finite(vec)
    assert all_finite(torch.empty(0, dtype=dtype))
    vec[617] = bad
    assert not all_finite(vec)
    grid = vec.reshape(10, 100)
    assert not all_finite(grid.t())          # a strided view: the same values
    assert all_finite(grid[:6].t())          # ... and one that leaves the bad row out
    assert not all_finite(vec.clone().requires_grad_(dtype.is_floating_point))
    # a huge but finite vector is finite (no shortcut through an overflowing sum)
    assert all_finite(torch.full((100,), torch.finfo(dtype).max, dtype=dtype))
