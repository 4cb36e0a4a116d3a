"""Scenario section ``[algorithm]``: one config model per server rule.

``[algorithm]`` is a discriminated union on ``name``: the name picks the
model, and each model accepts only its own algorithm's keys, so a FedBuff
key under ``name = "fedavg"`` is reported as unknown. A table without a
``name`` is :data:`DEFAULT_ALGORITHM`'s (:func:`fedsim.scenario.parse`
fills it in). :data:`_OPTIMIZERS_FOR` lists which client optimizers a
server rule can drive; :class:`fedsim.scenario.Scenario` checks it.

Example::

    [algorithm]
    name = "fedbuff"
    buffer_size = 8
    staleness = "poly"

Like :mod:`fedsim._netconfig`, this module defines its own strict base model
and bounded number types, so it imports nothing from :mod:`fedsim.scenario`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedsim._schema import NonNeg, Pos, Prob, SchemaModel

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "AlgorithmConfig",
    "AsyncFedEDConfig",
    "DGAScenarioConfig",
    "FedAsyncConfig",
    "FedAvgConfig",
    "FedBuffConfig",
    "FedSpeedScenarioConfig",
    "ScaffoldConfig",
]




class FedAvgConfig(SchemaModel):
    """Synchronous rounds (FedAvg; FedProx adds ``mu``)."""

    name: Literal["fedavg", "fedprox"]
    fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    min_clients: Annotated[int, Field(ge=1)] = 1
    over_selection: NonNeg = 0.0
    round_deadline: Pos | None = None
    server_lr: Pos = 1.0
    weighting: Literal["samples", "uniform"] = "samples"
    mu: NonNeg = 0.0

    @model_validator(mode="after")
    def _mu_only_for_fedprox(self) -> FedAvgConfig:
        if self.name == "fedavg" and self.mu != 0.0:
            raise ValueError(
                f"mu={self.mu} is FedProx's proximal weight; use name = \"fedprox\""
            )
        return self


class FedAsyncConfig(SchemaModel):
    """FedAsync: staleness-weighted mixing, ``concurrency`` tasks in flight."""

    name: Literal["fedasync"]
    alpha: Annotated[float, Field(gt=0, le=1)] = 0.6
    staleness: Literal["const", "poly", "hinge"] = "const"
    a: Pos = 0.5
    b: NonNeg = 4.0
    rho: NonNeg = 0.0
    staleness_offset: Literal[0, 1] = 0
    alpha_decay: Annotated[float, Field(gt=0, le=1)] = 1.0
    max_staleness: Annotated[int, Field(ge=0)] | None = None
    concurrency: Annotated[int, Field(ge=1)] = 4
    task_timeout: Pos | None = None


class _RoundsConfig(SchemaModel):
    """Fields every synchronous-round algorithm shares."""

    fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    min_clients: Annotated[int, Field(ge=1)] = 1
    over_selection: NonNeg = 0.0
    round_deadline: Pos | None = None
    server_lr: Pos = 1.0
    weighting: Literal["samples", "uniform"] = "uniform"


class FedSpeedScenarioConfig(_RoundsConfig):
    """FedSpeed (ALGORITHMS.md §5, §10.C): prox-correction + gradient perturbation."""

    name: Literal["fedspeed"]
    prox_lambda: Pos = 10.0
    perturb_alpha: Prob = 0.9375
    ascent_rho: NonNeg = 0.1
    ascent_mode: Literal["normalized", "constant"] = "normalized"
    prox: bool = True
    correction: bool = True
    perturbation: bool = True
    clip_norm: Pos | None = None


class ScaffoldConfig(_RoundsConfig):
    """SCAFFOLD (Karimireddy et al. 2020): control variates, option II by default."""

    name: Literal["scaffold"]
    option: Literal["I", "II"] = "II"


class _AsyncConfig(SchemaModel):
    concurrency: Annotated[int, Field(ge=1)] | None = None
    task_timeout: Pos | None = None


class AsyncFedEDConfig(_AsyncConfig):
    """AsyncFedED (§4, §10.D): Euclidean-distance staleness, adaptive K.

    ``concurrency`` defaults to every client (each trains as soon as it is
    free, as in the paper)."""

    name: Literal["asyncfeded"]
    lam: Pos = 5.0
    epsilon: Pos = 5.0
    gamma_bar: NonNeg = 3.0
    kappa: NonNeg = 1.0
    k_initial: Pos = 1.0
    k_min: Pos = 1.0
    k_max: Pos | None = None
    k_rounding: Literal["accumulate", "floor", "ceil", "round", "trunc"] = "accumulate"
    k_unit: Literal["epochs", "steps"] = "epochs"
    reset_k_on_reconnect: bool = False


class FedBuffConfig(_AsyncConfig):
    """FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation."""

    name: Literal["fedbuff"]
    buffer_size: Annotated[int, Field(ge=1)] = 4
    server_lr: Pos = 1.0
    staleness: Literal["const", "poly", "hinge"] = "poly"
    a: Pos = 0.5
    b: NonNeg = 4.0
    max_staleness: Annotated[int, Field(ge=0)] | None = None


class DGAScenarioConfig(SchemaModel):
    """DGA (§3): clients keep stepping while their round's average travels.

    ``delay`` is D in local steps (``mode = "paper"``: a real barrier at step
    D after sending; ``"auto"``: the correction lands whenever the average
    arrives). ``local_steps`` is K; the client's lr and momentum come from
    ``[client]`` (``optimizer = "sgd"`` or ``"sgdm"``)."""

    name: Literal["dga"]
    local_steps: Annotated[int, Field(ge=1)] = 10
    delay: Annotated[int, Field(ge=0)] = 5
    mode: Literal["paper", "auto"] = "paper"
    accumulate: Literal["raw", "displacement"] = "raw"
    correction: Literal["full", "none", "overwrite"] = "full"
    c_beta: Literal["paper"] | Pos = "paper"
    chunk_steps: Annotated[int, Field(ge=1)] = 1
    # auto mode: block while more sent rounds than this await their average
    # (§3.9); default 4 (s + 1) with s = (delay - 1) // local_steps
    max_pending: Annotated[int, Field(ge=1)] | None = None


DEFAULT_ALGORITHM = "fedasync"

AlgorithmConfig = Annotated[
    FedAvgConfig | FedAsyncConfig | AsyncFedEDConfig | FedBuffConfig | FedSpeedScenarioConfig
    | ScaffoldConfig | DGAScenarioConfig,
    Field(discriminator="name"),
]
ALGORITHMS = ("fedavg", "fedprox", "fedasync", "asyncfeded", "fedbuff", "fedspeed", "scaffold",
              "dga")


# Server rules whose local training drives the optimizer with a direction of
# its own (DGA's corrected step, FedSpeed's quasi-gradient, SCAFFOLD's
# corrected gradient) and so cannot run the closure-based step-size rules
# (Delta-SGD, SPS), which evaluate the loss themselves.
_OPTIMIZERS_FOR: dict[str, tuple[str, ...]] = {
    "dga": ("sgd", "sgdm"),
    "fedspeed": ("sgd", "sgdm", "adam", "adagrad"),
    "scaffold": ("sgd", "sgdm", "adam", "adagrad"),
}
