"""Building a run's data, model and client config from a scenario.

Every process (server, client hosts, torch workers) rebuilds the same
dataset and initial model from the scenario's seed; the builders here are
deterministic so the shards and weights agree bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsim.algorithms import LocalConfig
from fedsim.data import FederatedData, build_federated, federate
from fedsim.scenario import Scenario, plugins
from fedsim.scenario.sections import DATASETS, MODELS

if TYPE_CHECKING:
    import torch

__all__ = ["build_data", "build_model", "local_config", "model_shapes"]


def build_data(sc: Scenario) -> FederatedData:
    """The federated dataset of a scenario (a plug-in's through :func:`fedsim.data.federate`)."""
    d = sc.data
    options: dict[str, Any] = {}
    if d.partition == "dirichlet":
        options.update(dirichlet_alpha=d.dirichlet_alpha, recipe=d.dirichlet_recipe)
        if d.samples_per_client is not None:
            options["samples_per_client"] = d.samples_per_client
    if d.partition == "shards":
        options["classes_per_client"] = d.classes_per_client
    if d.dataset not in DATASETS:
        out = plugins.dataset(d.dataset)(num_clients=d.num_clients, seed=sc.seed, **d.options)
        return federate(d.dataset, out, num_clients=d.num_clients, partition=d.partition,
                        seed=sc.seed, **options)
    if d.dataset == "synthetic":
        options.update(
            alpha=d.synthetic_alpha, beta=d.synthetic_beta, iid=d.synthetic_iid,
            n_cap=d.max_samples_per_client,
            n_equal=None if d.synthetic_sizes == "lognormal" else int(d.synthetic_sizes),
        )
    if d.test_fraction is not None:
        if d.dataset in ("mnist", "cifar10"):
            raise ValueError(
                f"data.test_fraction={d.test_fraction}: {d.dataset} has its own fixed "
                "test split; remove test_fraction"
            )
        options["test_fraction"] = d.test_fraction
    if d.path is not None:
        options["path"] = d.path
    return build_federated(
        d.dataset, num_clients=d.num_clients, partition=d.partition, seed=sc.seed, **options
    )


def build_model(sc: Scenario, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """The initial model (identical in every process for one seed)."""
    from fedsim.models import build_from  # lazy: torch stays out of client hosts
    from fedsim.models import build_model as _build  # lazy: torch stays out of client hosts

    m = sc.model
    if m.name not in MODELS:
        return build_from(plugins.model(m.name), input_shape, num_classes, seed=sc.seed,
                          name=m.name, **m.options)
    options: dict[str, Any] = {}
    if m.name == "mlp":
        options["hidden_sizes"] = list(m.hidden)
    if m.name == "char_lstm":
        options["hidden_size"] = m.lstm_hidden
    return _build(m.name, input_shape, num_classes, seed=sc.seed, **options)


def model_shapes(model: torch.nn.Module) -> list[tuple[int, ...]]:
    """Shapes of the trainable parameters, in order."""
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def local_config(sc: Scenario) -> LocalConfig:
    """The local-training config every task carries."""
    c = sc.client
    prox = sc.algorithm.prox_mu()
    return LocalConfig(
        steps=c.local_steps,
        epochs=c.local_epochs,
        batch_size=c.batch_size,
        optimizer=c.optimizer_config(),
        prox_mu=prox,
    )
