"""Core-NATS subjects the bench service answers or emits besides its events,
shared by the agent, the coordinator and the CLI.

Progress lines and request-reply queries live outside every JetStream
stream's subjects (``safe.progress.*``, ``safe.query.*``): they are
ephemeral, and the history consumers must never see them as events.
"""

from __future__ import annotations

from libs.bus import QUERY_SUBJECT

# {"request_id", "node", "step", "elapsed_s"} while an agent runs a level.
PROGRESS_SUBJECT = "safe.progress.bench.{node}"
# Coordinator queries (JSON request -> JSON reply with "ok").
REPORT_SUBJECT = QUERY_SUBJECT.format(name="bench.report")
PAIR_SUBJECT = QUERY_SUBJECT.format(name="bench.pair")  # {"node", "request_id"}
SEARCH_SUBJECT = QUERY_SUBJECT.format(name="bench.search")  # {"nodes": [...]}
