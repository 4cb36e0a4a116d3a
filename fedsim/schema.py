"""The base model and constrained number types shared by every scenario section.

It sits at ``fedsim/``, not in :mod:`fedsim.scenario`: each algorithm's
``[algorithm]`` config is such a section too, and :mod:`fedsim.algorithms` is
below the scenario package (which imports it).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AtLeastOne", "FiniteNonNeg", "FinitePos", "NonNeg", "NonNegInt", "Pos", "Prob",
           "SchemaModel"]


class SchemaModel(BaseModel):
    """A scenario table: unknown keys are errors, values are frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


Pos = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]
Prob = Annotated[float, Field(ge=0, le=1)]
#: a rule's step sizes and bounds, where ``inf`` would make the model infinite or NaN
FinitePos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
FiniteNonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: a count of things that must be at least one (clients, steps, rounds, workers)
AtLeastOne = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
