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
# One node's share of a multi-node test (a bench.result as JSON), core NATS only:
# a share says nothing about the node alone, so bootstrap must not act on it.
SHARE_SUBJECT = QUERY_SUBJECT.format(name="bench.share.{session}")
# {"nodes": [...], "level": "standard", "turns": bool} -> every node's verdict
SWEEP_SUBJECT = QUERY_SUBJECT.format(name="bench.sweep")
