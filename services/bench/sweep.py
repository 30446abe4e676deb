"""Fleet sweeps for the coordinator: measure a set of nodes side by side and
judge each against the others of the same sweep.

A fleet-relative verdict is only as good as the baseline: nodes measured at
different times are compared with a machine room (or, for agents sharing one
machine, a machine) that has changed in between. A sweep measures its nodes
together — all at once on separate hardware, or taking turns sample by
sample (``turns.py``) where they share it — and judges every node against
the other nodes' runs from the same sweep, each figure weighed by how much it
scatters over this fleet's recent sweeps (``SpreadHistory``), not over this
sweep's few nodes alone. A node that looks unhealthy is
measured again in a second, smaller sweep together with a few nodes that
looked healthy, and judged against those fresh runs; only what that repeat
confirms is published.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Protocol

from libs.bus import Bus
from libs.events import BenchRequest, BenchRequestData, BenchResult, BenchResultData, BenchSweep
from libs.logs import get_logger
from libs.records import BenchRecord
from services.bench.config import ConfigFile
from services.bench.fleet import (
    NodeJudgement,
    Outcome,
    Spread,
    SpreadHistory,
    fleet_spread,
    score_ratio,
    weigh_retries,
)
from services.bench.protocol import TURN, SweepReply, SweepRequest, SweepVerdict, TurnRequest
from services.bench.triage import decide, measure_again
from services.bench.turns import TurnRing


class Judge(Protocol):
    """What a sweep needs of the coordinator (services.bench.coordinator):
    its bus and configuration, the fleet's latest runs, and its judgement,
    record and verdict steps, so both judge a sweep and a single run alike."""

    bus: Bus | None
    config: ConfigFile
    latest: dict[str, BenchRecord]

    def judge(self, data: BenchResultData, peers: dict[str, dict[str, float]],
              spread: Spread | None = None) -> tuple[NodeJudgement, tuple[Outcome, str]]: ...

    async def save(self, node: str, record: BenchRecord) -> None: ...

    async def publish_verdict(self, event: BenchResult, record: BenchRecord,
                              outcome: Outcome, reason: str, judged: NodeJudgement,
                              request_id: str) -> None: ...

HELPERS = 5  # healthy nodes measured again beside the suspects
NODE_TIMEOUT_S = 180.0  # a sweep waits this long per node (turns: nodes one at a time)


class Sweeps:
    def __init__(self, coordinator: Judge) -> None:
        self.coordinator = coordinator
        self.results: dict[str, dict[str, BenchResult]] = {}  # session -> node -> run
        self._arrived: dict[str, asyncio.Event] = {}
        self.stopping = False
        self.runs = 0
        self.noise = SpreadHistory()  # how much each figure scatters, sweep after sweep

    @property
    def _log(self) -> Any:
        return get_logger(component="sweep")  # bound late: after logging is configured

    def stop(self) -> None:
        """The coordinator is stopping: running sweeps end now with what they have."""
        self.stopping = True
        for arrived in self._arrived.values():
            arrived.set()

    def on_result(self, event: BenchResult) -> None:
        session = event.data.sweep
        if session in self._arrived:
            self.results.setdefault(session, {})[event.node] = event
            self._arrived[session].set()

    # ------------------------------------------------------------------ measuring

    async def _serve_turns(self, session: str, nodes: list[str]) -> tuple[Any, asyncio.Task[None]]:
        bus = self.coordinator.bus
        assert bus is not None
        ring = TurnRing.of(nodes)
        pending: dict[str, Any] = {}

        async def grant(names: list[str]) -> None:
            for name in names:
                msg = pending.pop(name, None)
                if msg is None:
                    continue
                try:
                    await msg.respond(b'{"ok": true}')
                except Exception as exc:  # an asker gone (or the bus): the next turn goes on
                    self._log.warning("turn not granted", node=name, error=repr(exc))

        async def on_msg(msg: Any) -> None:
            try:
                turn = TurnRequest.model_validate_json(msg.data)
            except ValueError:
                await msg.respond(b'{"ok": false, "error": "bad turn request"}')
                return
            node, op = turn.node, turn.op
            now = time.monotonic()
            if op == "acquire":
                pending[node] = msg
                await grant(ring.acquire(node, now))
                return
            granted = ring.leave(node, now) if op == "leave" else ring.release(node, now)
            await msg.respond(b'{"ok": true}')
            await grant(granted)

        async def expire() -> None:
            while True:
                await asyncio.sleep(1.0)
                await grant(ring.expire(time.monotonic()))

        # Answered when the turn is granted, not when asked: a plain subscription.
        sub = await bus.subscribe(TURN, on_msg, session=session)
        return sub, asyncio.create_task(expire())

    async def measure(self, session: str, nodes: list[str], *, level: str, turns: bool,
                      attempt: int = 1, retry_of: dict[str, str] | None = None
                      ) -> dict[str, BenchResult]:
        """Ask every node for the level as part of one sweep; their runs."""
        bus = self.coordinator.bus
        assert bus is not None
        subject = TURN.at(session=session) if turns else None
        sweep = BenchSweep(session=session, nodes=nodes, turn_subject=subject)
        self._arrived[session] = asyncio.Event()
        self.results[session] = {}
        served = await self._serve_turns(session, nodes) if turns else None
        try:
            for node in nodes:
                await bus.publish(BenchRequest(
                    id=f"{session}-{node}", source="bench-coordinator", node=node,
                    data=BenchRequestData(
                        level=level, reason=f"fleet sweep {session}", attempt=attempt,  # type: ignore[arg-type]
                        retry_of=(retry_of or {}).get(node), sweep=sweep)))
            deadline = time.monotonic() + NODE_TIMEOUT_S * (len(nodes) if turns else 1)
            while len(self.results[session]) < len(nodes) and time.monotonic() < deadline \
                    and not self.stopping:
                self._arrived[session].clear()
                try:  # wake at least every second to notice a stop
                    await asyncio.wait_for(self._arrived[session].wait(),
                                           min(1.0, max(0.0, deadline - time.monotonic())))
                except TimeoutError:
                    continue
        finally:
            del self._arrived[session]
            if served is not None:
                await served[0].unsubscribe()
                served[1].cancel()
        return self.results.pop(session)

    # ------------------------------------------------------------------ judging

    @staticmethod
    def _figures(runs: dict[str, BenchResult], nodes: list[str]) -> dict[str, dict[str, float]]:
        return {n: {f.name: f.value for f in runs[n].data.figures} for n in nodes if n in runs}

    async def run(self, request: SweepRequest) -> SweepReply:
        """Every node's verdict, after the repeat of any that looked unhealthy."""
        nodes, level, turns = list(request.nodes), request.level, request.turns
        coord = self.coordinator
        coord.config.reload()
        self.runs += 1
        session = f"sweep-{uuid.uuid4().hex[:10]}"
        t0 = time.monotonic()
        first = await self.measure(session, nodes, level=level, turns=turns)
        first_s = time.monotonic() - t0
        model = _model(first)
        # Each figure's scatter: this sweep's, or the typical one of the recent
        # sweeps where this sweep's came out smaller (SpreadHistory).
        pooled = self.noise.pooled(model, fleet_spread(self._figures(first, list(first))))
        judged = {}
        for node, run in first.items():
            others = [n for n in first if n != node]
            judged[node] = coord.judge(run.data, self._figures(first, others), pooled)
        decisions = {n: decide(local=local, fleet=(j.outcome, j.reason), first=None)
                     for n, (j, local) in judged.items()}
        suspects = sorted(n for n, d in decisions.items() if d.action == "retry")
        # The first pass without its suspects: how much this fleet scatters.
        calm = [n for n in first if n not in suspects]
        calm_spread = fleet_spread(self._figures(first, calm), {n: judged[n][0] for n in calm})
        # The fresh helpers of a repeat give the medians; the scatter is this
        # one, as the MAD of a few helpers is too noisy to trust.
        spread = self.noise.pooled(model, calm_spread)
        self.noise.add(model, calm_spread)
        verdicts: dict[str, SweepVerdict] = {}
        for node, decision in decisions.items():
            if decision.action == "verdict":
                await self._verdict(first[node], decision.outcome, decision.reason,
                                    judged[node][0], retried=False, out=verdicts)
        if suspects:
            healthy = [n for n, d in decisions.items() if d.action == "verdict"
                       and d.outcome == "healthy"]
            # The most typical healthy nodes: scores nearest the sweep's median.
            helpers = sorted(healthy, key=lambda n: (abs(_ratio(judged[n][0]) - 1), n))[:HELPERS]
            policy = coord.config.current.fleet
            repeats: dict[str, list[tuple[float, float]]] = {n: [] for n in suspects}
            pending, attempt = suspects, 2
            while pending:
                name = f"{session}-retry" + ("" if attempt == 2 else str(attempt - 1))
                again = await self.measure(name, pending + helpers, level=level, turns=turns,
                                           attempt=attempt,
                                           retry_of={n: f"{session}-{n}" for n in pending})
                peers = self._figures(again, [h for h in helpers if h in again])
                unsure = []
                for node in pending:
                    if node not in again:
                        continue
                    retry_judged, retry_local = coord.judge(again[node].data, peers, spread)
                    evidence, retry_judged = weigh_retries(retry_judged, repeats[node],
                                                           policy=policy)
                    if measure_again(evidence, attempt=attempt, max_retries=policy.max_retries,
                                     local=retry_local[0], fleet=retry_judged.outcome):
                        repeats[node].append((_ratio(retry_judged), retry_judged.score_z))
                        unsure.append(node)
                        continue
                    final = decide(local=retry_local,
                                   fleet=(retry_judged.outcome, retry_judged.reason),
                                   first=(decisions[node].outcome, decisions[node].reason),
                                   repeated=bool(set(judged[node][0].flagged)
                                                 & set(retry_judged.flagged)))
                    await self._verdict(again[node], final.outcome, final.reason, retry_judged,
                                        retried=True, out=verdicts,
                                        request_id=f"{session}-{node}")
                pending, attempt = unsure, attempt + 1
        missing = sorted(set(nodes) - set(first)) + [f"{n} (retry)" for n in suspects
                                                     if n not in verdicts]
        self._log.info("sweep done", session=session, nodes=len(nodes), suspects=suspects,
                       missing=missing, seconds=round(time.monotonic() - t0, 1),
                       scatter_of_sweeps=self.noise.sweeps(model))  # the typical one's basis
        return SweepReply(session=session, verdicts=verdicts, missing=missing,
                          suspects=suspects, seconds=round(time.monotonic() - t0, 2),
                          first_pass_s=round(first_s, 2))

    async def _verdict(self, run: BenchResult, outcome: Outcome, reason: str,
                       judged: NodeJudgement, *,
                       retried: bool, out: dict[str, SweepVerdict],
                       request_id: str | None = None) -> None:
        coord = self.coordinator
        record = coord.latest.get(run.node)
        if record is None:
            return
        request_id = request_id or run.data.request_id or run.id
        await coord.publish_verdict(run, record, outcome, reason, judged, request_id)
        await coord.save(run.node, record)
        out[run.node] = SweepVerdict(outcome=outcome, reason=reason, retried=retried,
                                     score=_ratio(judged) if judged.score else None,
                                     duration_s=run.data.duration_s, flagged=judged.flagged)


def _model(runs: dict[str, BenchResult]) -> str:
    """The GPU model(s) a sweep measured: its nodes are judged against each other."""
    return ",".join(sorted({r.data.gpu_model or r.data.device or "" for r in runs.values()}))


def _ratio(judged: NodeJudgement) -> float:
    """A node's score against its peers' (1.0: typical, or when unknown)."""
    ratio = score_ratio(judged)
    return 1.0 if ratio is None else ratio
