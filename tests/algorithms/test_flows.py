"""The algorithm protocol: the two generic server flows, DGA's flow and the registry.

Each bug fixed at this layer has its regression test here, named after it.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
import torch

from fedsim.algorithms import get
from fedsim.algorithms.api import (
    AlgorithmConfig,
    AlgorithmSpec,
    ServerContext,
    algorithm_names,
    register,
)
from fedsim.algorithms.dga import DGAFlow, DGAScenarioConfig, dga_config
from fedsim.algorithms.fedavg import FedAvg, FedAvgConfig
from fedsim.algorithms.fedbuff import FedBuff, FedBuffConfig
from fedsim.algorithms.flows import AsyncFlow, RoundRule, RoundsConfig, RoundsFlow
from fedsim.algorithms.local import LocalConfig
from fedsim.algorithms.optim import optimizer_config
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.errors import ScenarioError
from fedsim.scenario import parse
from fedsim.wire.messages import Update

N = 6


def _ctx(x0: torch.Tensor, clients: int = 4) -> ServerContext:
    local = LocalConfig(steps=2, optimizer=optimizer_config(name="sgd", lr=0.1))
    return ServerContext(x0=x0, num_clients=clients, seed=0, local=local)


def _result(client: int, params: torch.Tensor, *, task_id: int | None = None,
            base: int = 0, round_: int = 0) -> Update:
    return Update.of(client=client, base_version=base, params=params, num_samples=10,
                     steps=1, task_id=task_id or 0, round=round_)


def test_every_builtin_algorithm_is_registered_with_its_config():
    names = set(algorithm_names())
    assert {"fedavg", "fedprox", "fedasync", "asyncfeded", "fedbuff", "fedspeed", "scaffold",
            "dga"} <= names
    assert "flower" in names           # a built-in whose home is fedsim.flower
    required = {"flower": {"server_app": "app:server_app", "client_app": "app:client_app"}}
    for name in names:
        spec = get(name)
        assert name in spec.names
        cfg = spec.config.model_validate({"name": name, **required.get(name, {})})
        assert cfg.name == name


#: keys where infinity means "never": no timeout, no deadline, no clipping
MAY_BE_INFINITE = {"task_timeout", "round_deadline", "clip_norm"}


def test_every_float_key_of_every_algorithm_refuses_nan_and_all_but_never_refuse_inf():
    """A scenario that passes `fedsim check` must not fail later in a worker: FedSpeed's
    prox_lambda = inf passed the scenario and stopped every client at its start."""
    import math

    from pydantic import ValidationError

    seen = 0
    for name in sorted(set(algorithm_names())):
        cfg = get(name).config
        for key, field in cfg.model_fields.items():
            if "float" not in str(field.annotation):
                continue
            seen += 1
            for bad in (math.nan, -math.inf, *([] if key in MAY_BE_INFINITE else [math.inf])):
                with pytest.raises(ValidationError, match=key):
                    cfg.model_validate({"name": name, key: bad})
    assert seen > 20


def test_fedbuff_discard_for_max_staleness_is_reported_with_a_non_empty_buffer():
    """Bug 4: FedBuff dropped an update for max_staleness without a trace when its
    buffer held other updates."""
    x0 = torch.zeros(N)
    cfg = FedBuffConfig(buffer_size=2, max_staleness=0, concurrency=3)
    flow = AsyncFlow(FedBuff(cfg), cfg, _ctx(x0))
    step = flow.start([0, 1, 2], 0.0)
    tasks = {t.client: t for t in step.tasks}
    # client 0's update fills half the buffer (version stays 0)
    s0 = flow.update(_result(0, torch.ones(N), task_id=tasks[0].task_id), 1.0)
    assert s0.applied == []
    assert s0.discarded == []
    # a flush needs a second update; make one of staleness 1 by flushing first
    s1 = flow.update(_result(1, torch.ones(N), task_id=tasks[1].task_id), 1.1)
    assert len(s1.applied) == 1
    assert flow.version == 1
    # client 1 again, from version 1 (fresh), buffered: buffer non-empty
    (t1,) = s1.tasks
    assert (t1.client, t1.version) == (1, 1)
    flow.update(_result(1, torch.ones(N), task_id=t1.task_id, base=1), 1.2)
    # client 2 trained from version 0: staleness 1 > max_staleness 0
    s2 = flow.update(_result(2, torch.ones(N), task_id=tasks[2].task_id, base=0), 1.3)
    assert [d.client for d in s2.discarded] == [2]
    assert "max_staleness" in s2.discarded[0].reason
    assert s2.discarded[0].staleness == 1


class _Exploding(RoundRule):
    def aggregate(self, x, results):
        raise ValueError("Invalid round: the rule refuses it")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_an_aggregation_error_in_a_round_is_a_discard_not_a_crash():
    """Bug 6: an aggregation error in a synchronous round crashed the server."""
    flow = RoundsFlow(_Exploding(), RoundsConfig(name="exploding"), _ctx(torch.zeros(N), 2))
    step = flow.start([0, 1], 0.0)
    assert sorted(t.client for t in step.tasks) == [0, 1]
    flow.update(_result(0, torch.ones(N), round_=1), 1.0)
    step = flow.update(_result(1, torch.ones(N), round_=1), 1.0)
    assert step.applied == []
    assert sorted(d.client for d in step.discarded) == [0, 1]
    assert "refuses" in step.discarded[0].reason
    assert step.rounds_closed == 1
    assert sorted(t.client for t in step.tasks) == [0, 1]  # the next round opens


def _dga(clients: int) -> DGAFlow:
    cfg = DGAScenarioConfig(name="dga", local_steps=2, delay=1)
    return DGAFlow(dga_config(cfg, _ctx(torch.zeros(N)).local), torch.zeros(N))


def test_dga_round_completes_without_a_lost_client():
    """Bug 2: after a client was lost, the reducer rejected every later upload
    of an open round (it fixed the expected count), and DGA stalled."""
    flow = _dga(3)
    assert [t.client for t in flow.start([0, 1, 2], 0.0).tasks] == [0, 1, 2]
    assert flow.update(_result(0, torch.ones(N), round_=1), 1.0).applied == []
    step = flow.lost(2, 1.1)  # round 1 still waits for client 1
    assert step.applied == []
    step = flow.update(_result(1, 3 * torch.ones(N), round_=1), 1.2)
    assert step.discarded == []
    assert [a.round for a in step.applied] == [1]
    (b,) = step.broadcasts
    assert b.clients == (0, 1)
    assert torch.allclose(b.payload, 2 * torch.ones(N))
    # round 2: two reports close it
    flow.update(_result(0, torch.ones(N), round_=2), 2.0)
    assert flow.update(_result(1, torch.ones(N), round_=2), 2.1).rounds_closed == 1


def test_dga_losing_the_last_missing_client_closes_the_round():
    flow = _dga(3)
    flow.start([0, 1, 2], 0.0)
    flow.update(_result(0, torch.ones(N), round_=1), 1.0)
    flow.update(_result(1, 3 * torch.ones(N), round_=1), 1.0)
    step = flow.lost(2, 1.1)
    assert [a.round for a in step.applied] == [1]
    assert step.broadcasts[0].clients == (0, 1)


class _HalfConfig(AlgorithmConfig):
    name: Literal["halfway"]


class _Halfway(RoundRule):
    """x <- (x + mean(y)) / 2: an algorithm defined outside the package."""

    def aggregate(self, x, results):
        mean = torch.stack([r.params for r in results]).mean(0)
        return (x + mean) / 2, {"clients": [r.client for r in results]}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_an_algorithm_defined_outside_the_package_registers_and_validates():
    spec = register(AlgorithmSpec(
        names=("halfway",), config=_HalfConfig,
        server=lambda cfg, ctx: RoundsFlow(_Halfway(), RoundsConfig(name="halfway"), ctx),
        client=local_sgd_client), replace=True)
    sc = parse({"algorithm": {"name": "halfway"}})
    assert isinstance(sc.algorithm, _HalfConfig)
    server = get("halfway").server(sc.algorithm, _ctx(torch.zeros(N), clients=1))
    server.start([0], 0.0)
    step = server.update(_result(0, 2 * torch.ones(N), round_=1), 1.0)
    assert torch.equal(server.model(), torch.ones(N))
    assert step.applied[0].clients == (0,)
    with pytest.raises(ValueError, match="already registered"):
        register(AlgorithmSpec(names=("halfway",), config=_HalfConfig, server=spec.server,
                               client=spec.client))


def test_unknown_algorithm_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown algorithm .nope.*fedavg"):
        parse({"algorithm": {"name": "nope"}})


def test_rounds_flow_reproduces_fedavg_rule():
    cfg = FedAvgConfig()
    flow = RoundsFlow(FedAvg(cfg), cfg, _ctx(torch.zeros(N), 2))
    flow.start([0, 1], 0.0)
    flow.update(_result(0, torch.ones(N), round_=1), 1.0)
    step = flow.update(_result(1, 3 * torch.ones(N), round_=1), 1.0)
    assert torch.equal(flow.model(), 2 * torch.ones(N))
    assert step.applied[0].version == 1
    assert flow.version == 1


@pytest.mark.parametrize("reset", [False, True])
def test_asyncfeded_reset_k_on_reconnect_acts_when_a_client_rejoins(reset: bool):
    """Bug: ``algorithm.reset_k_on_reconnect`` had no effect in a run: the
    asynchronous flow never told the rule that a client came back."""
    spec = get("asyncfeded")
    cfg = spec.config.model_validate({"name": "asyncfeded", "k_initial": 10.0,
                                      "reset_k_on_reconnect": reset})
    flow = spec.server(cfg, _ctx(torch.zeros(N)))
    step = flow.start([0, 1], 0.0)
    tasks = {t.client: t for t in step.tasks}
    flow.update(_result(0, torch.full((N,), 0.01), task_id=tasks[0].task_id), 1.0)
    grown = flow.rule.next_k(0)
    assert grown != 10.0  # K moved away from k_initial with the update
    flow.rejoin(0, 2.0, reset=False)
    assert flow.rule.next_k(0) == (10.0 if reset else grown)


# -- a rule's parameters are its config's (issue 24, point 4) -------------------------

_RULED = ("fedasync", "fedbuff", "asyncfeded", "fedavg", "fedprox", "fedadam", "fedyogi",
          "fedadagrad", "fedavgm", "fedspeed", "scaffold")


@pytest.mark.parametrize("name", _RULED)
def test_the_builder_hands_the_rule_the_scenarios_config_itself(name: str):
    """No builder copies a config field by field into a constructor with its own
    defaults: the rule holds the validated ``[algorithm]`` table it was built from."""
    cfg = parse({"algorithm": {"name": name}}).algorithm
    rule = get(name).server(cfg, _ctx(torch.zeros(N))).rule
    if name == "scaffold":
        rule = rule.rule  # ScaffoldRounds over Scaffold's server
    assert rule.cfg is cfg


@pytest.mark.parametrize("name", [n for n in _RULED if n != "fedasync"])
def test_an_infinite_server_step_is_refused_on_load(name: str):
    """An infinite step size made the rule refuse to be built when the server
    started, or (FedAvg) made every later model infinite; the config refuses it
    on load now, so ``fedsim check`` says so."""
    key = "lam" if name == "asyncfeded" else "server_lr"
    with pytest.raises(ScenarioError, match=rf"algorithm\.{key}: Input should be a finite"):
        parse({"algorithm": {"name": name, key: float("inf")}})
