"""The server's table of client hosts: a host that ends after its goodbye is not lost."""

from __future__ import annotations

from fedsim.actors.hosts import HostTable
from fedsim.wire.messages import HostBye, HostHello


def _table() -> HostTable:
    t = HostTable(num_clients=4, fedsim_version="v", scenario_hash="s")
    for i, clients in enumerate(((0, 1), (2, 3))):
        assert t.hello(f"p{i}".encode(), HostHello(
            host=f"host-{i}", pid=100 + i, clients=clients, samples=(10, 10), boot_id="b",
            fedsim_version="v", scenario_hash="s")) is None
    return t


def _bye(host: str) -> HostBye:
    return HostBye(host=host, overruns=0, compute_deadlines=0, rejected=0, fidelity={})


def test_a_host_that_exits_without_a_goodbye_is_lost_with_its_clients() -> None:
    t = _table()
    assert t.lose("host-1", "exit code 0", 3.0) == [2, 3]
    assert t.failures == [{"host": "host-1", "reason": "exit code 0", "t": 3.0}]
    assert t.owner(2) is None
    assert t.owner(0) == b"p0"


def test_a_host_that_exits_after_its_goodbye_is_not_a_failure() -> None:
    # the end of a run: the host says goodbye and exits, possibly before the
    # server's own run has returned (the process watcher reports it then)
    t = _table()
    assert t.goodbye(b"p1", _bye("host-1")) is not None
    assert t.lose("host-1", "exit code 0", 9.0) == []
    assert t.failures == []
    assert [b.host for b in t.byes()] == ["host-1"]  # its measurements stay
    assert t.waiting_for_bye() == ["host-0"]


def test_a_host_must_register_the_partitions_sample_counts() -> None:
    t = HostTable(num_clients=4, fedsim_version="v", scenario_hash="s",
                  partition=(10, 12, 7, 9))
    hello = HostHello(host="host-0", pid=1, clients=(0, 1, 2), samples=(10, 10**12, 7),
                      boot_id="b", fedsim_version="v", scenario_hash="s")
    assert t.hello(b"p0", hello) == (
        "client 1 registered 1000000000000 training samples, but the scenario's partition "
        "gives it 12 (1 of 3 counts differ; the data a host holds is built from the "
        "scenario's seed)")
    assert t.registered() == {}
    honest = HostHello(host="host-0", pid=1, clients=(0, 1, 2), samples=(10, 12, 7),
                       boot_id="b", fedsim_version="v", scenario_hash="s")
    assert t.hello(b"p0", honest) is None
    assert t.registered() == {0: 10, 1: 12, 2: 7}


def test_the_same_process_registering_again_over_its_connection_is_a_repeat() -> None:
    """A host whose server was restarted registers its clients again (its connection had
    already come back and re-registered): the same process, key, clients and peer is
    that host again, never "already registered"; anything else is not a repeat."""
    t = _table()
    again = HostHello(host="host-0", pid=100, clients=(0, 1), samples=(10, 10), boot_id="b",
                      fedsim_version="v", scenario_hash="s")
    info = t.repeat(b"p0", again, None)
    assert info is not None
    assert info.name == "host-0"
    assert t.repeat(b"p1", again, None) is None                      # another connection
    other = HostHello(host="host-0", pid=999, clients=(0, 1), samples=(10, 10), boot_id="b",
                      fedsim_version="v", scenario_hash="s")
    assert t.repeat(b"p0", other, None) is None                      # another process
    assert t.repeat(b"p0", again, "someone-else") is None            # another key
    t.lose("host-0", "gone", 1.0)
    assert t.repeat(b"p0", again, None) is None                      # not alive
