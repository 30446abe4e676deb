"""The hosts file: which machines exist and what they hold. Bootstrap owns it;
the embedded stack writes one for its local nodes."""

from __future__ import annotations

import ipaddress
from collections import Counter
from typing import Literal

from pydantic import Field, field_validator, model_validator

from libs.events import Frozen, check_key

# GPU models the platform knows how to judge; "cpu" is a local node with no GPU.
KNOWN_GPU_MODELS = ("MI300X", "MI325X", "MI250X", "MI210", "H100", "H200", "A100", "cpu")


class HostSpec(Frozen):
    name: str
    ip: str
    roles: list[Literal["control-plane", "etcd", "worker"]] = Field(
        default_factory=lambda: ["worker"])
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_model: str
    gpu_count: int = Field(ge=0, le=64)
    ssh_user: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_key(value, "node name")

    @field_validator("ip")
    @classmethod
    def _ip(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (write e.g. 10.0.0.7)") from None
        return value

    @field_validator("gpu_model")
    @classmethod
    def _gpu_model(cls, value: str) -> str:
        if value not in KNOWN_GPU_MODELS:
            known = ", ".join(KNOWN_GPU_MODELS)
            raise ValueError(f"unknown GPU model {value!r}; use one of {known}")
        return value


class HostsFile(Frozen):
    cluster: str = "local"
    nodes: list[HostSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> HostsFile:
        for attr in ("name", "ip"):
            counts = Counter(getattr(n, attr) for n in self.nodes)
            dupes = sorted(v for v, c in counts.items() if c > 1)
            if dupes:
                raise ValueError(
                    f"duplicate node {attr}(s): {', '.join(dupes)}; each must be unique")
        return self


def local_hosts(count: int, *, gpus_per_node: int = 1) -> HostsFile:
    """Hosts for the embedded stack: ``count`` nodes on this machine, each
    offering its CPU as ``gpus_per_node`` device slot(s), two per rack."""
    return HostsFile(
        cluster="embedded",
        nodes=[
            HostSpec(
                name=f"node-{i}",
                ip=f"127.0.0.{i + 1}",
                labels={"rack": f"r{(i - 1) // 2 + 1}", "switch": "s1"},
                gpu_model="cpu",
                gpu_count=gpus_per_node,
            )
            for i in range(1, count + 1)
        ],
    )
