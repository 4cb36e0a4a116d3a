"""FedAvg: parity with x + eta_g sum_i w_i (y_i - x), order independence, validation."""

from __future__ import annotations

import itertools

import fedavg_reference as ref
import pytest
import torch

from fedsim.algorithms import FedAvg, fedavg_aggregate, weighted_average
from fedsim.algorithms.fedavg import FedAvgConfig
from fedsim.wire.errors import WireError
from fedsim.wire.messages import Update


def _results(
    gen: torch.Generator, x: torch.Tensor, counts: list[int]
) -> list[Update]:
    return [
        Update.of(
            client=i,
            base_version=0,
            params=x + torch.randn(x.shape, generator=gen),
            num_samples=n,
        )
        for i, n in enumerate(counts)
    ]


def _reference(x, results, server_lr, weighting):
    out = ref.fedavg(
        x.tolist(),
        [r.params.tolist() for r in results],
        [r.num_samples for r in results],
        server_lr=server_lr,
        weighting=weighting,
    )
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
@pytest.mark.parametrize("server_lr", [1.0, 0.5, 1.7])
def test_parity_with_reference_over_rounds(weighting, server_lr):
    gen = torch.Generator().manual_seed(0)
    rule = FedAvg(FedAvgConfig(server_lr=server_lr, weighting=weighting))
    x = torch.randn(9, generator=gen)
    for rnd in range(20):
        k = int(torch.randint(1, 7, (), generator=gen))
        counts = torch.randint(1, 200, (k,), generator=gen).tolist()
        results = _results(gen, x, counts)
        expected = _reference(x, results, server_lr, weighting)
        new, info = rule.aggregate(x, results)
        assert torch.allclose(new.double(), expected, rtol=1e-5, atol=1e-6), (
            f"round {rnd}"
        )
        assert info == {"clients": list(range(k))}
        # The functional core gives the same vector as the class.
        assert torch.equal(fedavg_aggregate(x, results, server_lr, weighting), new)
        x = new
    assert rule.state_dict() == {"rounds": 20}


def test_samples_weighting_uses_n_i():
    x = torch.zeros(2)
    results = [
        Update.of(client=0, base_version=0, params=torch.tensor([1.0, 0.0]), num_samples=1),
        Update.of(client=1, base_version=0, params=torch.tensor([4.0, 8.0]), num_samples=3),
    ]
    new, _ = FedAvg(FedAvgConfig(weighting="samples")).aggregate(x, results)
    assert torch.allclose(new, torch.tensor([3.25, 6.0]))
    new, _ = FedAvg(FedAvgConfig(weighting="uniform")).aggregate(x, results)
    assert torch.allclose(new, torch.tensor([2.5, 4.0]))


def test_server_lr_scales_the_pseudo_gradient():
    x = torch.tensor([1.0, 1.0])
    results = [Update.of(client=0, base_version=0, params=torch.tensor([3.0, -1.0]), num_samples=5)]
    new, _ = FedAvg(FedAvgConfig(server_lr=0.5)).aggregate(x, results)
    assert torch.allclose(new, torch.tensor([2.0, 0.0]))
    new, _ = FedAvg(FedAvgConfig(server_lr=2.0)).aggregate(x, results)
    assert torch.allclose(new, torch.tensor([5.0, -3.0]))


def test_an_update_of_no_samples_cannot_exist():
    """A client without samples has no weight because it has no update: the update
    record refuses ``num_samples`` 0 (the server weighs by the partition, whose
    counts registration requires to be at least 1)."""
    with pytest.raises(WireError, match="num_samples"):
        Update.of(client=1, base_version=0, params=torch.tensor([100.0, -100.0]), num_samples=0)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
@pytest.mark.parametrize("server_lr", [1.0, 0.3])
def test_order_independence(weighting, server_lr):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, generator=gen)
    results = _results(gen, x, [3, 17, 1, 40, 8])
    cfg = FedAvgConfig(server_lr=server_lr, weighting=weighting)
    base, _ = FedAvg(cfg).aggregate(x, results)
    for perm in itertools.permutations(results):
        new, _ = FedAvg(cfg).aggregate(x, list(perm))
        assert torch.allclose(new, base, rtol=1e-6, atol=1e-7)


def test_empty_round_rejected():
    rule = FedAvg(FedAvgConfig())
    with pytest.raises(ValueError, match="no results"):
        rule.aggregate(torch.zeros(2), [])
    assert rule.state_dict() == {"rounds": 0}


def test_fedavg_aggregate_rejects_unknown_weighting():
    r = [Update.of(client=0, base_version=0, params=torch.ones(2), num_samples=1)]
    with pytest.raises(ValueError, match=r"Invalid weighting: 'mean'"):
        fedavg_aggregate(torch.zeros(2), r, weighting="mean")


@pytest.mark.parametrize(
    ("counts", "match"),
    [([0, 0], r"need w >= 0, sum > 0"), ([5, -1], r"\[5\.0, -1\.0\]")],
)
def test_invalid_sample_counts_rejected(counts, match):
    # no update can carry them (the record refuses num_samples < 1) ...
    with pytest.raises(WireError, match="num_samples must be >= 1"):
        [Update.of(client=i, base_version=0, params=torch.ones(2), num_samples=n)
         for i, n in enumerate(counts)]
    # ... and the average refuses them as weights
    with pytest.raises(ValueError, match=match):
        weighted_average([torch.ones(2), torch.ones(2)], [float(n) for n in counts])


def test_one_non_finite_result_rejects_the_whole_round_naming_the_client():
    results = [
        Update.of(client=0, base_version=0, params=torch.ones(3), num_samples=1),
        Update.of(client=7, base_version=0, params=torch.tensor([1.0, float("nan"), 2.0]),
                  num_samples=1),
    ]
    rule = FedAvg(FedAvgConfig())
    with pytest.raises(ValueError, match="update from client 7"):
        rule.aggregate(torch.zeros(3), results)
    assert rule.state_dict() == {"rounds": 0}


def test_weighted_average_validates_lengths():
    with pytest.raises(ValueError, match="2 weights for 1 vectors"):
        weighted_average([torch.ones(2)], [1.0, 2.0])
    with pytest.raises(ValueError, match="zero vectors"):
        weighted_average([], [])
