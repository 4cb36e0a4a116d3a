"""The Flower bridge's two sides, in process and without the actors: the ServerApp's
thread, its grid, fedsim's server side and client side exchanging real Flower
messages through fedsim's wire encoding."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytestmark = pytest.mark.flower

from flwr.common.constant import ErrorCode  # noqa: E402

from fedsim.algorithms.api import ClientContext, ServerContext, Waker  # noqa: E402
from fedsim.algorithms.local import LocalConfig  # noqa: E402
from fedsim.flower.client import FlowerClient  # noqa: E402
from fedsim.flower.config import FlowerConfig  # noqa: E402
from fedsim.flower.server import FlowerServer  # noqa: E402
from fedsim.wire.messages import Update  # noqa: E402


def _cfg(**kw: object) -> FlowerConfig:
    return FlowerConfig(server_app="tiny_app:server_app", client_app="tiny_app:client_app",
                        **kw)


def _until(cond, seconds: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Wait (real time) for the ServerApp's thread to reach ``cond``."""
    import time

    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "the ServerApp's thread did not get there"
        time.sleep(0.005)


class _Driver:
    """fedsim's server loop in miniature: wakes, tasks, replies, on a fake clock."""

    def __init__(self, cfg: FlowerConfig, clients: list[int]) -> None:
        self.woken = threading.Event()
        waker = Waker()
        waker.bind(self.woken.set)
        self.server = FlowerServer(cfg, ServerContext(
            x0=torch.zeros(4), num_clients=len(clients), seed=1, local=LocalConfig(),
            wake=waker))
        self.client = FlowerClient(cfg, ClientContext(model=torch.nn.Linear(1, 1),
                                                      local=LocalConfig(), seed=1,
                                                      num_clients=len(clients)))
        self.now = 0.0
        self.stop: str | None = None
        self.tasks = list(self.server.start(clients, 0.0).tasks)
        self.applied = []

    def run(self, drop: set[int] = frozenset(), limit: int = 200) -> None:
        for _ in range(limit):
            if not self.tasks:
                assert self.woken.wait(10), "the ServerApp pushed nothing"
                self.woken.clear()
                step = self.server.timer(self.now)
                self.tasks += step.tasks
                if step.stop:
                    self.stop = step.stop
                    return
                continue
            task = self.tasks.pop(0)
            self.now += 1.0
            if task.client in drop:
                step = self.server.lost(task.client, self.now)
            else:
                out = self.client.begin(task, torch.zeros(1), torch.zeros(1),
                                        torch.Generator())
                up = Update.of(client=task.client, task_id=task.task_id,
                               base_version=task.version, round=task.round,
                               num_samples=7 + task.client, params=out.upload)
                step = self.server.update(up, self.now)
                self.applied += step.applied
            self.tasks += step.tasks
        raise AssertionError("the run did not end")

    def final(self, result: dict[str, object]) -> np.ndarray:
        """Run to the end; the ServerApp's final model (finite, as ``result`` holds it)."""
        self.run()
        self.server.close()
        assert self.stop == "server_app_finished"
        w = result["arrays"]
        assert isinstance(w, np.ndarray)
        assert np.all(np.isfinite(w))
        return w


def test_fedavg_rounds_cross_the_bridge_and_state_persists(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    import tiny_app

    d = _Driver(_cfg(run_config={"num-server-rounds": 3}), [0, 1, 2])
    w = d.final(tiny_app.RESULT)
    assert np.linalg.norm(w) > 0.5
    assert len(d.applied) == 9                       # 3 rounds x 3 train replies
    assert {a.staleness for a in d.applied} == {(0,)}
    # Context.state persisted per client across rounds (and into the state file)
    state = FlowerClient(_cfg(), ClientContext(model=torch.nn.Linear(1, 1),
                                               local=LocalConfig(), seed=1))
    state.load_state_dict(d.client.state_dict())
    assert {c: int(s["calls"]["n"]) for c, s in state.states.items()} == {0: 3, 1: 3, 2: 3}


def test_a_lost_node_is_answered_node_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    d = _Driver(_cfg(run_config={"num-server-rounds": 2}), [0, 1, 2])
    seen: list[int] = []
    senders: set[int] = set()
    real = d.server.exchange.deliver

    def spy(reply, *more):  # type: ignore[no-untyped-def]
        if reply.has_error():
            seen.append(reply.error.code)
            senders.add(reply.metadata.src_node_id)
        return real(reply, *more)

    d.server.exchange.deliver = spy  # type: ignore[method-assign]
    d.run(drop={2})
    d.server.close()
    assert ErrorCode.NODE_UNAVAILABLE in seen
    assert senders == {1}                            # the SuperLink's, as in Flower
    assert d.stop == "server_app_finished"           # the rounds went on without it
    assert {a.clients[0] for a in d.applied} == {0, 1}
    assert len(d.applied) == 4                       # 2 rounds x the 2 nodes left


STRATEGIES = ["FedAvg", "FedProx", "FedAdam", "FedYogi", "FedAdagrad", "FedAvgM",
              "FedTrimmedAvg", "FedMedian", "Krum"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flowers_strategies_run_over_send_and_receive(
        strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of Flower's built-in strategies drives fedsim's grid to its end, every
    train reply reaching it with the server's record of the client's samples in
    place of the client's claim (10,000)."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    import tiny_app

    tiny_app.RESULT.clear()
    d = _Driver(_cfg(run_config={"num-server-rounds": 2, "strategy": strategy}),
                [0, 1, 2, 3, 4])
    weights: list[tuple[int, int]] = []
    real = d.server.exchange.deliver

    def spy(reply, *more):  # type: ignore[no-untyped-def]
        if reply.has_content() and "calls" in reply.content["metrics"]:
            weights.append((reply.metadata.src_node_id - 1000,
                            int(reply.content["metrics"]["num-examples"])))
        return real(reply, *more)

    d.server.exchange.deliver = spy  # type: ignore[method-assign]
    w = d.final(tiny_app.RESULT)
    assert np.any(w != 0)
    assert len(weights) == 10
    assert all(n == 7 + node for node, n in weights)


def test_push_and_pull_in_arrival_order_and_staleness_emerges(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An asynchronous Flower strategy written with push_messages / pull_messages:
    replies reach it in their arrival order, and a reply to a model that was
    replaced meanwhile counts as stale (here: by the replies that came first)."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    import push_pull_app

    push_pull_app.ORDER.clear()
    cfg = FlowerConfig(server_app="push_pull_app:server_app",
                       client_app="tiny_app:client_app", run_config={"updates": 7})
    d = _Driver(cfg, [0, 1, 2])
    d.run()
    d.server.close()
    assert d.stop == "server_app_finished"
    assert push_pull_app.ORDER[:3] == [0, 1, 2]          # the driver's arrival order
    # 7 replies reached the strategy; messages still in flight when it stopped
    # may be answered too (counted, never pulled)
    assert 7 <= len(d.applied) <= 9
    # the driver answers every task it holds before it looks at new pushes, so
    # the first three replies answer the first model; later replies find up to
    # two newer models pushed meanwhile (one per reply before them)
    stale = [a.staleness[0] for a in d.applied]
    assert stale[:3] == [0, 0, 0], stale
    assert 1 <= max(stale) <= 2, stale


def test_a_timeout_and_a_ttl_run_in_emulated_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that never answers: send_and_receive returns at its timeout, counted
    from the send on fedsim's clock; the message's TTL, also emulated, then gives
    the strategy Flower's REPLY_MESSAGE_UNAVAILABLE for it."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    import timeout_app

    d = _Driver(FlowerConfig(server_app="timeout_app:server_app",
                             client_app="tiny_app:client_app"), [0, 1])
    step = None
    assert d.woken.wait(10)
    d.woken.clear()
    step = d.server.timer(0.0)
    (t0, _) = step.tasks
    assert d.server.next_timer() == pytest.approx(5.0)    # send_and_receive(timeout=5)
    out = d.client.begin(t0, torch.zeros(1), torch.zeros(1), torch.Generator())
    d.server.update(Update.of(client=0, task_id=t0.task_id, base_version=t0.version,
                              round=0, num_samples=3, params=out.upload), 1.0)
    assert not d.woken.wait(0.2)                          # one reply of two: it waits
    assert timeout_app.GOT == []
    d.server.timer(5.0)                                   # emulated t = 5: the timeout
    _until(lambda: timeout_app.GOT)                       # returns the one reply; then
    assert timeout_app.GOT == [[0]]
    assert d.server.next_timer() == pytest.approx(20.0)   # the message's ttl = 20
    d.server.timer(20.0)
    assert d.woken.wait(10)
    d.woken.clear()
    step = d.server.timer(20.0)
    d.server.close()
    assert timeout_app.LATE == [ErrorCode.REPLY_MESSAGE_UNAVAILABLE]
    assert step.stop == "server_app_finished"


def test_a_legacy_app_runs_as_flower_converts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """ServerApp(server_fn=...) with the old FedAvg and ClientApp(client_fn=...) with
    a NumPyClient: Flower turns both into messages, and those cross fedsim's grid."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    cfg = FlowerConfig(server_app="legacy_app:server_app", client_app="legacy_app:client_app")
    d = _Driver(cfg, [0, 1, 2])
    d.run()
    d.server.close()
    assert d.stop == "server_app_finished"
    assert len(d.applied) == 6                   # 2 rounds x 3 fit replies


def test_a_message_the_network_lost_frees_its_node_at_its_ttl(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node works on one message at a time, the next one waits; when the first is
    lost on the way (no reply ever comes), its TTL answers it and the node takes the
    waiting one, as task_timeout frees a native client. The lost message's reply, if
    it comes after all, is discarded as late and frees nothing."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    import lost_app

    lost_app.GOT.clear()
    d = _Driver(FlowerConfig(server_app="lost_app:server_app",
                             client_app="tiny_app:client_app"), [0])
    assert d.woken.wait(10)
    d.woken.clear()
    (lost,) = d.server.timer(0.0).tasks                  # the second waits for the node
    assert d.server.next_timer() == pytest.approx(5.0)   # the first's TTL
    assert d.server.timer(4.0).tasks == []
    (second,) = d.server.timer(5.0).tasks                # TTL: the node takes the next
    assert second.task_id != lost.task_id
    out = d.client.begin(second, torch.zeros(1), torch.zeros(1), torch.Generator())
    step = d.server.update(Update.of(client=0, task_id=second.task_id,
                                     base_version=second.version, round=0, num_samples=3,
                                     params=out.upload), 6.0)
    assert len(step.applied) == 1
    _until(lambda: len(lost_app.GOT) == 2)
    assert lost_app.GOT == [(0, ErrorCode.REPLY_MESSAGE_UNAVAILABLE), (1, None)]
    late = d.server.update(Update.of(client=0, task_id=lost.task_id, base_version=lost.version,
                                     round=0, num_samples=3, params=out.upload), 7.0)
    assert [x.reason for x in late.discarded] == ["reply after its message's TTL"]
    assert d.server.late_replies == 1
    assert d.server.busy == {}
    assert d.woken.wait(10)
    assert d.server.timer(7.0).stop == "server_app_finished"
    d.server.close()


def test_a_client_app_sees_its_own_flower_node_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ClientApp's Context.node_id and its message's dst_node_id are the node id the
    ServerApp sent to (1000 + the client), never the SuperLink's 1."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    import tiny_app

    tiny_app.SEEN.clear()
    d = _Driver(_cfg(run_config={"num-server-rounds": 1}), [0, 1, 2])
    d.final(tiny_app.RESULT)
    assert sorted(tiny_app.SEEN) == [(1000, 1000), (1001, 1001), (1002, 1002)]


def test_a_flower_outside_the_tested_range_is_refused_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.flower import config

    monkeypatch.setattr(config.importlib.metadata, "version", lambda name: "1.30.0")
    with pytest.raises(config.FlowerMissing, match=r"Flower 1\.30\.0 is installed; fedsim "
                                                   r"runs flwr>=1\.38,<2"):
        config.require_flower()
    monkeypatch.setattr(config.importlib.metadata, "version", lambda name: "1.42.0")
    config.require_flower()
