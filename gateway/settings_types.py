"""The settings tree's shared pieces: its strict base model and its constrained names."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
Priority = Literal["interactive", "batch"]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class Strict(BaseModel):
    """Unknown fields are errors (a typo fails at start-up), and settings never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)
