"""The settings tree's shared pieces: its strict base model, its constrained names, and
an S3 endpoint (the weight stager's and the batch file store's)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, StringConstraints

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
Priority = Literal["interactive", "batch"]
# Traffic-core controllers a benchmark may switch off (TrafficSettings.controllers_off).
Controller = Literal["pacing", "prefill_gate", "measured_drain"]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class Strict(BaseModel):
    """Unknown fields are errors (a typo fails at start-up), and settings never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class S3Settings(Strict):
    endpoint_url: str | None = None  # None: AWS; else MinIO, R2, moto...
    region: str = "us-east-1"
    # None: the default AWS credential chain (IRSA, instance profile, env).
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
