"""What bootstrap hears, says and keeps."""

from __future__ import annotations

from libs.events import (
    BenchRequest,
    BenchResult,
    FaultClosed,
    FaultOpened,
    LogRecord,
    NodeCordonRequested,
    NodeDrainRequested,
    NodeProvisioned,
    NodeRegistered,
    NodeRemoved,
    NodeStateChanged,
    NodeUncordonRequested,
)
from libs.records import INVENTORY, JOBS, NODES
from libs.routes import Consumer, On, Routes, Serve
from libs.topology import CONTROL
from services.bootstrap.protocol import APPLY, REMOVE

ROUTES = Routes(
    service="bootstrap",
    summary="the hosts file, node registration and onboarding state",
    consumes=(
        Consumer("bootstrap", CONTROL, (
            On(BenchResult, "on_bench_result"),
            On(FaultOpened, "on_fault_opened"),
            On(FaultClosed, "on_fault_closed"),
            On(NodeCordonRequested, "on_node_command"),
            On(NodeUncordonRequested, "on_node_command"),
            On(NodeDrainRequested, "on_node_command"),
        ), summary="verdicts, faults and operators' holds move nodes through onboarding"),
        # Its own durable: an existing "bootstrap" consumer keeps its filter on
        # upgrade (the bus leaves consumers as they are), so it would never see these.
        Consumer("bootstrap-provisioned", CONTROL, (
            On(NodeProvisioned, "on_node_provisioned"),
        ), summary="Kubespray's result per node"),
    ),
    publishes=(NodeRegistered, NodeStateChanged, NodeRemoved, BenchRequest, LogRecord),
    owns=(NODES, INVENTORY),
    reads=(JOBS,),  # a node leaves only once no job runs on it
    serves=(Serve(APPLY, "on_apply"), Serve(REMOVE, "on_remove")),
)
