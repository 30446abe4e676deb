"""What a cluster driver tells a training worker, through its environment.

One model for both sides: the local and Kubernetes drivers build a
``WorkerEnv`` and write it out with ``as_env`` (the variable names are the
aliases: torchrun's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... and the
platform's ``PRIMUS_*``); the training SDK (``libs.sdk.Run``) reads it back
with ``from_env``. ``RankEnv`` is the torchrun part alone, for programs that
torchrun starts (the bench's GPU collectives). Nothing else parses these
variables by hand.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# The job's own NATS credential (libs.job_credentials): its user and password.
WORKER_ENV_USER = "PRIMUS_JOB_NATS_USER"
WORKER_ENV_PASSWORD = "PRIMUS_JOB_NATS_PASSWORD"
SECRET_ENV = frozenset({"PRIMUS_NATS_TOKEN", WORKER_ENV_PASSWORD})


class WorkerEnvError(ValueError):
    """The environment does not describe a worker (a variable is malformed)."""


class RankEnv(BaseModel):
    """torchrun's variables: where this rank is in the gang."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    rank: int = Field(default=0, ge=0, alias="RANK")
    local_rank: int = Field(default=0, ge=0, alias="LOCAL_RANK")
    world_size: int = Field(default=1, ge=1, alias="WORLD_SIZE")
    master_addr: str = Field(default="127.0.0.1", alias="MASTER_ADDR")
    master_port: int = Field(default=29500, ge=1, le=65535, alias="MASTER_PORT")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read from ``environ`` (the process's environment by default);
        unset variables take their defaults (a script run by hand)."""
        env = os.environ if environ is None else environ
        names = {f.alias for f in cls.model_fields.values() if f.alias}
        try:
            return cls.model_validate({k: env[k] for k in names if env.get(k) not in (None, "")})
        except ValidationError as exc:
            problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())
            raise WorkerEnvError(f"the worker's environment is not valid: {problems}") from None

    def as_env(self) -> dict[str, str]:
        """The variables to set, by name (unset optional ones left out)."""
        out = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is not None and field.alias:
                out[field.alias] = str(value)
        return out


class WorkerEnv(RankEnv):
    """Everything a worker is told: its rank in the gang and, for the SDK,
    its job, attempt, node, checkpoint directory and the bus."""

    job: str = Field(default="local", alias="PRIMUS_JOB_ID")
    attempt: int = Field(default=1, ge=1, alias="PRIMUS_ATTEMPT")
    node: str = Field(default="local", alias="PRIMUS_NODE_NAME")
    checkpoint_dir: Path | None = Field(
        default=None, alias="PRIMUS_CHECKPOINT_DIR",
        description="where every rank writes its checkpoints (shared); default "
                    "checkpoints/<job> under the working directory")
    checkpoint_interval: int = Field(default=50, ge=1, alias="PRIMUS_CHECKPOINT_INTERVAL")
    device_slots: int | None = Field(default=None, ge=0, alias="PRIMUS_DEVICE_SLOTS",
                                     description="devices (GPUs) this rank was given")
    nats_url: str | None = Field(default=None, alias="PRIMUS_NATS_URL")
    nats_token: str | None = Field(default=None, alias="PRIMUS_NATS_TOKEN")
    nats_user: str | None = Field(
        default=None, alias=WORKER_ENV_USER,
        description="the job's own NATS user (libs.job_credentials)")
    nats_password: str | None = Field(
        default=None, alias=WORKER_ENV_PASSWORD, description="its password (a secret)")
    # A pod runs one worker per node; a torchrun started inside it over the
    # pod's GPUs reads these (Kubernetes driver).
    nnodes: int | None = Field(default=None, ge=1, alias="NNODES")
    node_rank: int | None = Field(default=None, ge=0, alias="NODE_RANK")

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_dir or Path("checkpoints") / self.job

    def public_env(self) -> dict[str, str]:
        """``as_env`` without the token and the job's NATS password (secrets,
        set from a Secret on Kubernetes)."""
        return {k: v for k, v in self.as_env().items() if k not in SECRET_ENV}
