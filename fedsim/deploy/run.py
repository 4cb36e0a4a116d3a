"""``fedsim server`` and ``fedsim clients``: one federation across machines.

Both are built on the same actors as ``fedsim run`` (:mod:`fedsim.launch.runner`,
:mod:`fedsim.actors.host`); only who starts the client hosts differs. The
server binds an address, client hosts connect to it from wherever they run,
register (clock offset, version and scenario hash checked) and the
federation starts once every client of the scenario is present, or after
``deploy.start_timeout`` with those that are. netem applies each client's
links on its own host (downlink) and at the server (uplink), so the
emulated network is the same wherever a client runs.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.actors.host import serve_host
from fedsim.actors.process import run_loop
from fedsim.deploy.keys import KeysError, load_client_keys, load_server_keys
from fedsim.errors import DeployError
from fedsim.launch.prep import finish, prepare, prepare_resume
from fedsim.launch.runner import serve
from fedsim.results.values import RunResult
from fedsim.scenario import Scenario, resolved
from fedsim.wire.curve import ClientKeys, ServerKeys
from fedsim.wire.transport import is_loopback

if TYPE_CHECKING:
    from collections.abc import Callable

    from fedsim.actors.runstate import Progress

__all__ = ["client_keys", "run_clients", "run_server", "server_keys"]

log = logging.getLogger(__name__)


def server_keys(bind: str, keys_dir: str | None, insecure: bool, num_clients: int
                ) -> tuple[ServerKeys | None, dict[str, tuple[int, ...]] | None]:
    """The server's CURVE keys and allow-list, or None when authentication is off.

    Authentication is on for any non-loopback bind unless ``insecure``.
    """
    if keys_dir is not None and insecure:
        raise DeployError("--keys and --insecure exclude each other")
    if keys_dir is None:
        if not insecure and not is_loopback(bind):
            raise DeployError(
                f"{bind} is reachable from other machines: give --keys DIR (made by "
                "`fedsim keys DIR --hosts N`) so that only your client hosts can join, or "
                "--insecure on a trusted lab network")
        return None, None
    try:
        keys, allowed = load_server_keys(keys_dir, num_clients)
    except KeysError as exc:
        raise DeployError(str(exc)) from None
    return keys, {h.name: h.ids for h in allowed}


def client_keys(connect: str, keys_dir: str | None, name: str, insecure: bool
                ) -> ClientKeys | None:
    """A client host's CURVE keys, or None when authentication is off."""
    if keys_dir is not None and insecure:
        raise DeployError("--keys and --insecure exclude each other")
    if keys_dir is None:
        if not insecure and not is_loopback(connect):
            raise DeployError(
                f"{connect} is another machine: give --keys DIR (holding {name}.key_secret and "
                "server.key, made by `fedsim keys`), or --insecure if the server runs with "
                "--insecure")
        return None
    try:
        return load_client_keys(keys_dir, name)
    except KeysError as exc:
        raise DeployError(str(exc)) from None


def run_server(sc: Scenario | None, *, bind: str, out: str | None, keys_dir: str | None,
               insecure: bool, dilation: float | str | None = None,
               resume: str | None = None,
               on_progress: Callable[[Progress], None] | None = None) -> RunResult:
    """``fedsim server``: serve one federation at ``bind`` until it ends.

    With ``resume`` (a run directory) it continues that run from its last
    checkpoint; client hosts connect again as at a start.
    """
    import torch  # lazy: torch stays out of client hosts (fedsim clients imports this module)

    torch.set_num_threads(1)
    if resume is not None:
        sc, run_dir, choice, data = prepare_resume(resume)
    assert sc is not None
    keys, allowed = server_keys(bind, keys_dir, insecure, sc.data.num_clients)
    if resume is None:
        hosts = len(allowed) if allowed else 1
        sc, run_dir, choice, data = prepare(sc, out, dilation, hosts)
    summary = run_loop(serve(sc, run_dir, choice, data, bind=bind, keys=keys, allowed=allowed,
                             resume=resume is not None, on_progress=on_progress),
                       sc.deploy.loop)
    finish(run_dir)
    return RunResult.of(run_dir, summary)


def run_clients(sc: Scenario, *, connect: str, ids: list[int], name: str,
                keys_dir: str | None, insecure: bool, state_dir: str | None = None) -> int:
    """``fedsim clients``: run client host ``name`` (clients ``ids``) until the server stops.

    Returns the host's exit code (0 done, 3 the server went silent, 4 refused, 2 its
    torch worker did not start).
    """
    keys = client_keys(connect, keys_dir, name, insecure)
    data: dict[str, Any] = resolved(sc)
    with tempfile.TemporaryDirectory(prefix="fedsim-host-") as tmp:
        scenario_file = str(Path(tmp) / "scenario.json")
        Path(scenario_file).write_text(json.dumps(data))
        run_id = f"{socket.gethostname()}-{os.getpid()}"
        return run_loop(serve_host(sc, scenario_file, data, connect=connect, name=name,
                                   clients=ids, run_id=run_id, keys=keys,
                                   state_dir=state_dir), sc.deploy.loop)
