"""The Flower bridge's two sides without the actors: the ServerApp in its own process
with its grid, fedsim's server side (in this process) and client side exchanging real
Flower messages through the pipe and fedsim's wire encoding. The apps report what
their strategies saw through a log file (:mod:`applog`)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytestmark = pytest.mark.flower

import applog  # noqa: E402
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402

from fedsim.algorithms.api import ClientContext, ServerContext, Waker  # noqa: E402
from fedsim.algorithms.local import LocalConfig  # noqa: E402
from fedsim.flower.apps import AppError  # noqa: E402
from fedsim.flower.client import FlowerClient  # noqa: E402
from fedsim.flower.config import FlowerConfig  # noqa: E402
from fedsim.flower.content import reply_bytes  # noqa: E402
from fedsim.flower.exchange import Reply  # noqa: E402
from fedsim.flower.grid import FedsimGrid  # noqa: E402
from fedsim.flower.server import FlowerServer  # noqa: E402
from fedsim.wire.messages import Update  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _apps_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test apps import as a scenario's would (the ServerApp's process gets this
    process's path)."""
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "app.jsonl"


def _cfg(log: Path, **run_config: object) -> FlowerConfig:
    return FlowerConfig(server_app="tiny_app:server_app", client_app="tiny_app:client_app",
                        run_config={"log": str(log), **run_config})


def _until(cond, seconds: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Wait (real time) for the ServerApp's process to reach ``cond``."""
    import time

    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "the ServerApp's process did not get there"
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

    def run(self, drop: set[int] = frozenset(), limit: int = 200, settle: float = 0.0) -> None:
        """Answer every task in turn; with nothing to answer, wait for the app to
        push (and ``settle`` real seconds more: what it pushes meanwhile goes too)."""
        import time

        for _ in range(limit):
            if not self.tasks:
                assert self.woken.wait(20), "the ServerApp pushed nothing"
                time.sleep(settle)
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

    def final(self, log: Path) -> np.ndarray:
        """Run to the end; the ServerApp's final model (finite, as its log holds it)."""
        self.run()
        self.server.close()
        assert self.stop == "server_app_finished"
        (w,) = [np.asarray(e["arrays"]) for e in applog.read(log) if "arrays" in e]
        assert np.all(np.isfinite(w))
        return w


def test_fedavg_rounds_cross_the_bridge_and_state_persists(log: Path) -> None:
    d = _Driver(_cfg(log, **{"num-server-rounds": 3}), [0, 1, 2])
    w = d.final(log)
    assert np.linalg.norm(w) > 0.5
    assert len(d.applied) == 9                       # 3 rounds x 3 train replies
    assert {a.staleness for a in d.applied} == {(0,)}
    # Context.state persisted per client across rounds (and into the state file)
    state = FlowerClient(_cfg(log), ClientContext(model=torch.nn.Linear(1, 1),
                                                  local=LocalConfig(), seed=1))
    state.load_state_dict(d.client.state_dict())
    assert {c: int(s["calls"]["n"]) for c, s in state.states.items()} == {0: 3, 1: 3, 2: 3}


def test_a_lost_node_is_answered_node_unavailable(log: Path) -> None:
    d = _Driver(_cfg(log, **{"num-server-rounds": 2}), [0, 1, 2])
    seen: list[int] = []
    real = d.server.exchange.deliver

    def spy(reply, *more):  # type: ignore[no-untyped-def]
        if not reply.from_node:
            seen.append(reply.code)
        return real(reply, *more)

    d.server.exchange.deliver = spy  # type: ignore[method-assign]
    d.run(drop={2})
    d.server.close()
    assert ErrorCode.NODE_UNAVAILABLE in seen
    assert d.stop == "server_app_finished"           # the rounds went on without it
    assert {a.clients[0] for a in d.applied} == {0, 1}
    assert len(d.applied) == 4                       # 2 rounds x the 2 nodes left


def _pushed(node: int = 1003) -> Message:
    msg = Message(RecordDict({"arrays": ArrayRecord([np.zeros(2, np.float32)])}), node, "train")
    msg.metadata.__dict__["_message_id"] = "m-1"
    return msg


def test_the_replies_the_strategy_receives_are_built_as_flowers() -> None:
    """In the ServerApp's process: an error the server answers comes from the
    SuperLink's node (1) with Flower's code; a node's reply keeps only its content,
    with the metadata derived from the message and the server's num-examples."""
    msg = _pushed()
    err = FedsimGrid._reply(msg, Reply.node_unavailable("m-1"))
    assert err.has_error()
    assert err.error.code == ErrorCode.NODE_UNAVAILABLE
    assert (err.metadata.src_node_id, err.metadata.dst_node_id) == (1, 1)
    assert err.metadata.reply_to_message_id == "m-1"
    theirs = Message(RecordDict({"metrics": MetricRecord({"num-examples": 10_000, "x": 2})}),
                     reply_to=msg)
    theirs.metadata.__dict__["_src_node_id"] = 7        # a node may claim anything
    got = FedsimGrid._reply(msg, Reply("m-1", data=reply_bytes(theirs), num_examples=12))
    assert got.metadata.src_node_id == 1003
    assert got.metadata.reply_to_message_id == "m-1"
    assert got.content["metrics"]["num-examples"] == 12
    assert got.content["metrics"]["x"] == 2


STRATEGIES = ["FedAvg", "FedProx", "FedAdam", "FedYogi", "FedAdagrad", "FedAvgM",
              "FedTrimmedAvg", "FedMedian", "Krum"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flowers_strategies_run_over_send_and_receive(strategy: str, log: Path) -> None:
    """Each of Flower's built-in strategies drives fedsim's grid to its end, every
    train reply reaching it with the server's record of the client's samples in
    place of the client's claim (10,000)."""
    d = _Driver(_cfg(log, **{"num-server-rounds": 2, "strategy": strategy}), [0, 1, 2, 3, 4])
    w = d.final(log)
    assert np.any(w != 0)
    weights = [tuple(x) for e in applog.read(log) if "seen" in e for x in e["seen"]]
    assert len(weights) == 10
    assert all(n == 7 + node for node, n in weights)


def test_push_and_pull_in_arrival_order_and_staleness_emerges(log: Path) -> None:
    """An asynchronous Flower strategy written with push_messages / pull_messages:
    replies reach it in their arrival order, and a reply to a model that was
    replaced meanwhile counts as stale (here: by the replies that came first)."""
    cfg = FlowerConfig(server_app="push_pull_app:server_app",
                       client_app="tiny_app:client_app",
                       run_config={"updates": 7, "log": str(log)})
    d = _Driver(cfg, [0, 1, 2])
    d.run(settle=0.2)      # the app answers a round of replies with a push per reply
    d.server.close()
    assert d.stop == "server_app_finished"
    order = [e["node"] for e in applog.read(log)]
    assert order[:3] == [0, 1, 2]                        # the driver's arrival order
    # 7 replies reached the strategy; messages still in flight when it stopped
    # may be answered too (counted, never pulled)
    assert 7 <= len(d.applied) <= 9
    # the driver answers every task it holds before it looks at new pushes, so
    # the first three replies answer the first model; the app then pushes a new
    # model per reply it pulled, and a reply finds up to two newer models pushed
    # after its own
    stale = [a.staleness[0] for a in d.applied]
    assert stale[:3] == [0, 0, 0], stale
    assert 1 <= max(stale) <= 2, stale


def test_a_timeout_and_a_ttl_run_in_emulated_seconds(log: Path) -> None:
    """A node that never answers: send_and_receive returns at its timeout, counted
    from the send on fedsim's clock; the message's TTL, also emulated, then gives
    the strategy Flower's REPLY_MESSAGE_UNAVAILABLE for it."""
    d = _Driver(FlowerConfig(server_app="timeout_app:server_app",
                             client_app="tiny_app:client_app", run_config={"log": str(log)}),
                [0, 1])
    step = None
    assert d.woken.wait(20)
    d.woken.clear()
    step = d.server.timer(0.0)
    (t0, _) = step.tasks
    assert d.server.next_timer() == pytest.approx(5.0)    # send_and_receive(timeout=5)
    out = d.client.begin(t0, torch.zeros(1), torch.zeros(1), torch.Generator())
    d.server.update(Update.of(client=0, task_id=t0.task_id, base_version=t0.version,
                              round=0, num_samples=3, params=out.upload), 1.0)
    assert not d.woken.wait(0.2)                          # one reply of two: it waits
    assert applog.read(log) == []
    d.server.timer(5.0)                                   # emulated t = 5: the timeout
    _until(lambda: applog.read(log))                      # returns the one reply; then
    assert applog.read(log) == [{"got": [0]}]
    assert d.server.next_timer() == pytest.approx(20.0)   # the message's ttl = 20
    d.server.timer(20.0)
    assert d.woken.wait(20)
    d.woken.clear()
    step = d.server.timer(20.0)
    d.server.close()
    assert applog.read(log)[1:] == [{"late": [ErrorCode.REPLY_MESSAGE_UNAVAILABLE]}]
    assert step.stop == "server_app_finished"


def test_a_legacy_app_runs_as_flower_converts_it() -> None:
    """ServerApp(server_fn=...) with the old FedAvg and ClientApp(client_fn=...) with
    a NumPyClient: Flower turns both into messages, and those cross fedsim's grid."""
    cfg = FlowerConfig(server_app="legacy_app:server_app", client_app="legacy_app:client_app")
    d = _Driver(cfg, [0, 1, 2])
    d.run()
    d.server.close()
    assert d.stop == "server_app_finished"
    assert len(d.applied) == 6                   # 2 rounds x 3 fit replies


def test_a_message_the_network_lost_frees_its_node_at_its_ttl(log: Path) -> None:
    """A node works on one message at a time, the next one waits; when the first is
    lost on the way (no reply ever comes), its TTL answers it and the node takes the
    waiting one, as task_timeout frees a native client. The lost message's reply, if
    it comes after all, is discarded as late and frees nothing."""
    d = _Driver(FlowerConfig(server_app="lost_app:server_app",
                             client_app="tiny_app:client_app", run_config={"log": str(log)}),
                [0])
    assert d.woken.wait(20)
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
    _until(lambda: len(applog.read(log)) == 2)
    assert [e["got"] for e in applog.read(log)] == [[0, ErrorCode.REPLY_MESSAGE_UNAVAILABLE],
                                                   [1, None]]
    late = d.server.update(Update.of(client=0, task_id=lost.task_id, base_version=lost.version,
                                     round=0, num_samples=3, params=out.upload), 7.0)
    assert [x.reason for x in late.discarded] == ["reply after its message's TTL"]
    assert d.server.late_replies == 1
    assert d.server.busy == {}
    assert d.woken.wait(20)
    assert d.server.timer(7.0).stop == "server_app_finished"
    d.server.close()


def test_a_client_app_sees_its_own_flower_node_id(log: Path) -> None:
    """The ClientApp's Context.node_id and its message's dst_node_id are the node id the
    ServerApp sent to (1000 + the client), never the SuperLink's 1."""
    import tiny_app

    tiny_app.SEEN.clear()
    d = _Driver(_cfg(log, **{"num-server-rounds": 1}), [0, 1, 2])
    d.final(log)
    assert sorted(tiny_app.SEEN) == [(1000, 1000), (1001, 1001), (1002, 1002)]


def test_the_serverapp_runs_in_its_own_process_and_ends_with_the_run(log: Path) -> None:
    """The ServerApp is not a thread of the server's process: closing the run ends its
    process (a polling app's next call raises Flower's RunNotRunningException)."""
    cfg = FlowerConfig(server_app="push_pull_app:server_app",
                       client_app="tiny_app:client_app",
                       run_config={"updates": 1000, "log": str(log)})
    d = _Driver(cfg, [0, 1])
    process = d.server.app.process
    assert process.pid != __import__("os").getpid()
    assert process.poll() is None
    assert not [t for t in threading.enumerate() if "serverapp" in t.name]
    assert d.woken.wait(20)
    d.server.close()                                     # the app still polls for replies
    assert process.poll() is not None                    # ended, within END_TIMEOUT
    assert d.server.timer(1.0).stop == "server_app_finished"


def test_a_serverapp_that_cannot_be_loaded_is_refused_naming_it(tmp_path: Path) -> None:
    cfg = FlowerConfig(server_app="tiny_app:no_such_app", client_app="tiny_app:client_app")
    with pytest.raises(AppError, match=r"'tiny_app:no_such_app': module tiny_app has no "
                                       r"attribute 'no_such_app'"):
        _Driver(cfg, [0])


def test_a_serverapp_that_raises_ends_the_run_saying_so(tmp_path: Path) -> None:
    (tmp_path / "raising_app.py").write_text(
        "from flwr.serverapp import ServerApp\n"
        "server_app = ServerApp()\n"
        "@server_app.main()\n"
        "def main(grid, context):\n"
        "    list(grid.get_node_ids())\n"
        "    raise KeyError('num-server-rounds')\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        d = _Driver(FlowerConfig(server_app="raising_app:server_app",
                                 client_app="tiny_app:client_app"), [0])
        d.run()
        d.server.close()
    finally:
        sys.path.remove(str(tmp_path))
    assert d.stop == "failed: the ServerApp raised KeyError: 'num-server-rounds'"


def test_a_flower_outside_the_tested_range_is_refused_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.flower import config

    monkeypatch.setattr(config.importlib.metadata, "version", lambda name: "1.30.0")
    with pytest.raises(config.FlowerMissing, match=r"Flower 1\.30\.0 is installed; fedsim "
                                                   r"runs flwr>=1\.38,<2"):
        config.require_flower()
    monkeypatch.setattr(config.importlib.metadata, "version", lambda name: "1.42.0")
    config.require_flower()


def test_the_exchange_says_when_a_wait_may_return_without_a_thread_per_wait() -> None:
    """watch(): the relay's one answering thread is told when a send_and_receive's
    replies are in (by the delivery that completes it, at once if already done, or
    by the run's end), and finish() hands them over without waiting."""
    from fedsim.flower.content import Head
    from fedsim.flower.exchange import Exchange, Pushed, RunEnded

    head = Head(dst=1000, ttl=10.0, type="train", group="1", created=0.0, run=1)
    ex = Exchange()
    _, number = ex.push([Pushed(head, "a", b"", b""), Pushed(head, "b", b"", b"")],
                          batch=True)
    assert number is not None
    told: list[int] = []
    ex.watch(number, lambda: told.append(number))
    ex.deliver(Reply("b", data=b"x"))
    assert told == []                                 # one of two
    ex.deliver(Reply.node_unavailable("a"))
    assert told == [number]                           # by the delivery that completed it
    assert [r.message_id for r in ex.finish(number)] == ["b", "a"]   # arrival order
    _, done = ex.push([Pushed(head, "c", b"", b"")], batch=True)
    assert done is not None
    ex.deliver(Reply("c", data=b"y"))
    late: list[int] = []
    ex.watch(done, lambda: late.append(done))        # already complete: at once
    assert late == [done]
    assert [r.message_id for r in ex.finish(done)] == ["c"]
    _, open_ = ex.push([Pushed(head, "d", b"", b"")], batch=True)
    assert open_ is not None
    ended: list[int] = []
    ex.watch(open_, lambda: ended.append(open_))
    ex.close()                                        # the run ends before its reply
    assert ended == [open_]
    with pytest.raises(RunEnded):
        ex.finish(open_)
