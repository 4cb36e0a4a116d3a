"""Flower apps, unchanged, on fedsim's network: a ServerApp and its ClientApps, algorithm "flower".

``[algorithm] name = "flower"`` names a Flower Message-API app (Flower 1.38
and later): a ``flwr.serverapp.ServerApp`` and a ``flwr.clientapp.ClientApp``
as ``module:attribute`` references, found like fedsim's plug-ins (installed,
on ``PYTHONPATH``, or next to the scenario file), and the app's run config::

    [algorithm]
    name = "flower"
    server_app = "mylab.app:server_app"
    client_app = "mylab.app:client_app"
    run_config = { "num-server-rounds" = 20, "lr" = 0.05 }

Modules: :mod:`.spec` (the algorithm fedsim registers), :mod:`.config` (its
``[algorithm]`` table), :mod:`.server` (the server side: the ServerApp's
process, its messages as tasks), :mod:`.serverapp` (that process: the app
run on :mod:`.grid`'s Grid), :mod:`.link` (the pipe between the two
processes), :mod:`.exchange` (where the app's calls meet the server's
loop), :mod:`.client` (the client side: the ClientApp called per client in
the trainers), :mod:`.content`
(how a message crosses the wire), :mod:`.apps` (loading an app),
:mod:`.running` (what the app's code can ask of the run) and :mod:`.data`
(the helpers an app imports: each client's data, as fedsim partitions it).
docs/flower.md is the user's guide.

Flower is an optional extra (``pip install fedsim[flower]``): importing this
package imports none of it.
"""

from fedsim.flower.data import SCENARIO_KEY, eval_set, partition, scenario_data

__all__ = ["SCENARIO_KEY", "eval_set", "partition", "scenario_data"]
