"""Contracts every server rule in the registry (conftest.ALGO_DB) must keep."""

from __future__ import annotations

import copy

import pytest
import torch

from fedsim.algorithms import NonFiniteUpdate
from fedsim.wire import statefile
from fedsim.wire.messages import Update

DIM = 6


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_same_trace(a, b) -> None:
    assert len(a) == len(b)
    for step, ((x1, i1), (x2, i2)) in enumerate(zip(a, b, strict=True)):
        assert (x1 is None) == (x2 is None), f"step {step}: one discarded, one not"
        if x1 is not None:
            assert torch.equal(x1, x2), f"step {step}: outputs differ"
        assert i1 == i2, f"step {step}: info differs"


def test_valid_inputs_construct(valid_case):
    info, inp = valid_case
    info.factory(**inp.kwargs)


def test_error_inputs_raise_naming_the_value(error_case):
    info, err = error_case
    with pytest.raises(err.error, match=err.match):
        info.factory(**err.kwargs)


def test_determinism(algo_case):
    info, inp = algo_case

    def once():
        gen = _gen(1234)
        x0 = torch.randn(DIM, generator=gen)
        trace, x, version = info.run(info.factory(**inp.kwargs), x0, 0, gen, 25)
        return trace, x, version

    t1, x1, v1 = once()
    t2, x2, v2 = once()
    _assert_same_trace(t1, t2)
    assert torch.equal(x1, x2)
    assert v1 == v2
    assert v1 > 0


def test_state_dict_round_trip(algo_case):
    info, inp = algo_case
    gen = _gen(7)
    x = torch.randn(DIM, generator=gen)
    original = info.factory(**inp.kwargs)
    _, x, version = info.run(original, x, 0, gen, 9)

    saved = copy.deepcopy(original.state_dict())
    fresh = info.factory(**inp.kwargs)
    fresh.load_state_dict(saved)
    assert fresh.state_dict() == original.state_dict()

    gen_state = gen.get_state()
    t_orig, x_orig, v_orig = info.run(original, x, version, gen, 6)
    gen.set_state(gen_state)
    t_fresh, x_fresh, v_fresh = info.run(fresh, x, version, gen, 6)
    _assert_same_trace(t_orig, t_fresh)
    assert torch.equal(x_orig, x_fresh)
    assert v_orig == v_fresh
    assert fresh.state_dict() == original.state_dict()


def _through_a_file(state):
    """``state`` written as a checkpoint's state file and read back."""
    return statefile.loads(statefile.encode(state, "checkpoint").to_bytes(), "checkpoint")


def _same(a, b) -> bool:
    """Equal down to the types (a tuple is not a list, a client id not its string)."""
    enc = statefile.encode
    return enc(a, "x").to_bytes() == enc(b, "x").to_bytes()


def test_state_dict_survives_the_checkpoint_format(algo_case):
    """What a checkpoint keeps of a rule (AsyncFedED's history, FedBuff's buffer, FedOpt's
    moments, SCAFFOLD's and FedSpeed's per-client state, DGA's open rounds) comes back
    exactly from the file, which is read without unpickling anything."""
    info, inp = algo_case
    gen = _gen(17)
    x = torch.randn(DIM, generator=gen)
    original = info.factory(**inp.kwargs)
    _, x, version = info.run(original, x, 0, gen, 9)
    state = original.state_dict()
    back = _through_a_file(state)
    assert _same(back, state)
    fresh = info.factory(**inp.kwargs)
    fresh.load_state_dict(back)
    assert _same(fresh.state_dict(), original.state_dict())

    gen_state = gen.get_state()
    t_orig, x_orig, v_orig = info.run(original, x, version, gen, 6)
    gen.set_state(gen_state)
    t_fresh, x_fresh, v_fresh = info.run(fresh, x, version, gen, 6)
    _assert_same_trace(t_orig, t_fresh)
    assert torch.equal(x_orig, x_fresh)
    assert v_orig == v_fresh


def test_state_dict_survives_stepping_unchanged(algo_case):
    """state_dict() returns a snapshot: later steps do not rewrite it."""
    info, inp = algo_case
    gen = _gen(8)
    rule = info.factory(**inp.kwargs)
    x = torch.randn(DIM, generator=gen)
    snapshot = rule.state_dict()
    frozen = copy.deepcopy(snapshot)
    info.run(rule, x, 0, gen, 5)
    assert snapshot == frozen


def test_zero_staleness_unit_step_is_the_sync_rule(algo_case):
    """FedAsync with d = 0 and alpha = 1, FedAvg of one result with eta_g = 1."""
    info, inp = algo_case
    rule = info.factory(**{**inp.kwargs, **info.sync_kwargs})
    gen = _gen(3)
    x = torch.randn(DIM, generator=gen)
    version = 4
    y = torch.randn(DIM, generator=gen)
    result = Update.of(client=0, base_version=version, params=y, num_samples=17)
    new, _ = info.apply(rule, x, version, [result])
    assert new is not None
    if inp.fresh_is_sync:
        assert torch.equal(new, y)
    else:
        assert not torch.allclose(new, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
# a model is one flat vector (fedsim.algorithms.api, rule 3): an update carries one
@pytest.mark.parametrize("shape", [(1,), (5,)], ids=["1", "5"])
def test_dtype_and_shape_preserved_inputs_untouched(algo_case, dtype, shape):
    info, inp = algo_case
    gen = _gen(11)
    rule = info.factory(**inp.kwargs)
    x = torch.randn(shape, generator=gen, dtype=dtype)
    version = 0
    for _ in range(8):
        results = info.draw(gen, x, version)
        x_before = x.clone()
        params_before = [r.params.clone() for r in results]
        new, _ = info.apply(rule, x, version, results)
        assert torch.equal(x, x_before), "the global model was modified in place"
        for r, p in zip(results, params_before, strict=True):
            assert torch.equal(r.params, p), "a client result was modified in place"
        if new is not None:
            assert new.dtype == dtype
            assert new.shape == torch.Size(shape)
            x, version = new, version + 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_update_rejected_state_unchanged(algo_case, bad):
    info, inp = algo_case
    gen = _gen(5)
    rule = info.factory(**inp.kwargs)
    x = torch.randn(DIM, generator=gen)
    _, x, version = info.run(rule, x, 0, gen, 4)
    results = info.draw(gen, x, version)
    poisoned = results[-1].params.clone()
    poisoned.view(-1)[2] = bad
    results[-1] = results[-1].with_params(poisoned)
    state = copy.deepcopy(rule.state_dict())
    x_before = x.clone()
    with pytest.raises(NonFiniteUpdate, match="non-finite"):
        info.apply(rule, x, version, results)
    assert rule.state_dict() == state
    assert torch.equal(x, x_before)


def test_non_finite_update_is_a_value_error():
    assert issubclass(NonFiniteUpdate, ValueError)


def test_wrong_length_update_rejected(algo_case):
    info, inp = algo_case
    rule = info.factory(**inp.kwargs)
    x = torch.zeros(DIM)
    short = Update.of(client=0, base_version=0, params=torch.ones(1), num_samples=3)
    with pytest.raises(ValueError, match=r"shape|length|size"):
        info.apply(rule, x, 0, [short])
