"""What lens-collector hears, says and keeps."""

from __future__ import annotations

from libs.events import EVENT_TYPES, JobProgress, LensAlert, LogRecord
from libs.routes import Consumer, On, Routes, Serve, events_of
from libs.topology import CONTROL, TELEMETRY
from services.lens_collector.protocol import LENS_QUERY

ALERTS_ROLE = "lens-alerts"  # the replica that evaluates the alert rules (libs.leader)
# The ack wait of the shared consumers: what a replica had in hand when it
# died goes to another within this. A batch that takes longer to store is
# kept alive (libs.consume: +WPI), so it is not delivered twice meanwhile.
REPLICA_HANDOVER_S = 5.0
DELIVERY_DURABLE = "lens-alert-delivery"
DELIVERY_REPLAY_S = 900.0

ROUTES = Routes(
    service="lens-collector",
    summary="telemetry and history into ClickHouse, named queries, alert rules; replicas "
            "share the work",
    consumes=(
        Consumer("lens-events", CONTROL,
                 tuple(On(e, "on_events") for e in events_of(CONTROL, EVENT_TYPES)),
                 mode="batch", batch=256, ack_wait_s=REPLICA_HANDOVER_S,
                 summary="every control event, into the history table"),
        Consumer("lens-telemetry", TELEMETRY,
                 tuple(On(e, "on_telemetry") for e in events_of(TELEMETRY, EVENT_TYPES)),
                 mode="raw", batch=20000, fill_s=0.8, inflight=2,
                 ack_wait_s=REPLICA_HANDOVER_S,
                 summary="node, job and log telemetry, handed to the engine as raw JSON"),
        # Started only where receivers are configured; a new one starts
        # DELIVERY_REPLAY_S back, not at the stream's first alert.
        Consumer(DELIVERY_DURABLE, CONTROL, (On(LensAlert, "on_alert"),),
                 replay_s=DELIVERY_REPLAY_S,
                 summary="alert transitions, queued for Alertmanager and webhooks "
                         "(PRIMUS_LENS_ALERT_RECEIVERS)"),
    ),
    publishes=(LensAlert, LogRecord, JobProgress),
    serves=(Serve(LENS_QUERY, "on_query", queue="lens"),),
    leases=(ALERTS_ROLE,),
)
