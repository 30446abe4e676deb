"""Multi-node tests for the coordinator: pairing a node with a known-healthy
partner (full level) and running the binary-split search over the nodes of a
failing collective.

A test is a set of ``bench.request`` events that carry the same rendezvous
(session, node order, master address and port): each agent joins the
torch.distributed group with its node rank and reports its share as a
``bench.result`` with that session. The master address is the node's IP from
bootstrap's inventory (``nodes`` bucket), else the loopback address.
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import Mapping

from libs.bus import Bus
from libs.events import (
    BenchCheck,
    BenchRendezvous,
    BenchRequest,
    BenchRequestData,
    BenchResult,
    BenchResultData,
)
from libs.logs import get_logger
from libs.records import NODES, BenchRecord, BenchRun
from services.bench.config import ConfigFile
from services.bench.protocol import PairReply, PairRequest, SearchReply, SearchRequest
from services.bench.split_search import Group, SplitSearch
from services.bench.triage import Candidate, choose_partner, group_passed, rendezvous_port, waves

INTERNODE_PREFIX = "internode_allreduce"


class MultiNode:
    def __init__(self, bus: Bus, config: ConfigFile, latest: Mapping[str, BenchRecord],
                 source: str) -> None:
        self.bus = bus
        self.config = config
        self.latest = latest
        self.source = source
        self.shares: dict[str, dict[str, BenchResult]] = {}  # session -> node -> share
        self._arrived: dict[str, asyncio.Event] = {}
        self.searches = 0
        self.stopping = False
        self._log = get_logger(component="multinode")

    def stop(self) -> None:
        self.stopping = True
        for arrived in self._arrived.values():
            arrived.set()

    def on_share(self, event: BenchResult) -> None:
        session = event.data.session
        assert session is not None
        self.shares.setdefault(session, {})[event.node] = event
        if session in self._arrived:
            self._arrived[session].set()

    async def _address(self, node: str) -> str:
        try:
            record = await (await self.bus.records(NODES)).get(node)
        except Exception:
            record = None
        return record.spec.ip if record is not None else "127.0.0.1"

    def _model_and_ranks(self, node: str) -> tuple[str, int]:
        run = self._last_run(node)
        if run is None:
            return "", 1
        ranks = run.device_count if run.device != "cpu" else 1
        return run.gpu_model or run.device, max(1, ranks)

    def _last_run(self, node: str) -> BenchRun | None:
        record = self.latest.get(node)
        runs = list(record.levels.values()) if record is not None else []
        return max(runs, key=lambda r: r.time) if runs else None

    def _candidates(self) -> list[Candidate]:
        out = []
        for node, record in self.latest.items():
            verdict = record.verdict
            model, _ = self._model_and_ranks(node)
            out.append(Candidate(node, model, verdict.outcome if verdict else None,
                                 verdict.time if verdict else 0.0))
        return out

    async def _rendezvous(self, session: str, nodes: list[str], purpose: str
                          ) -> BenchRendezvous:
        full = self.config.current.full
        _, ranks = self._model_and_ranks(nodes[0])
        return BenchRendezvous(
            session=session, nodes=nodes, master_addr=await self._address(nodes[0]),
            master_port=rendezvous_port(session, base=full.port_base, span=full.port_span),
            ranks_per_node=ranks, timeout_s=full.rendezvous_timeout_s, purpose=purpose)

    async def _ask(self, rdv: BenchRendezvous, nodes: list[str], reason: str) -> None:
        for node in nodes:
            await self.bus.publish(BenchRequest(
                id=f"{rdv.session}-{node}", source=self.source, node=node,
                data=BenchRequestData(level="full", reason=reason, rendezvous=rdv)))

    # ------------------------------------------------------------------ pairing

    async def pair(self, request: PairRequest) -> PairReply:
        """An agent running the full level asks for a partner: choose one, ask
        it to join, and answer with the rendezvous for both."""
        node, request_id = request.node, request.request_id
        model, _ = self._model_and_ranks(node)
        partner = choose_partner(node, model, self._candidates())
        if partner is None:
            return PairReply(ok=False, error=f"no known-healthy partner of model {model!r} yet "
                                             "(run the standard level on the fleet first)")
        rdv = await self._rendezvous(f"pair-{request_id}", [node, partner],
                                     f"pair {node} with healthy {partner}")
        await self._ask(rdv, [partner], f"partner for {node}'s full bench")
        self._log.info("paired", node=node, partner=partner, session=rdv.session)
        return PairReply(rendezvous=rdv)

    # ------------------------------------------------------------------ split search

    def _reference_gbps(self, model: str) -> float | None:
        values = [f.value for record in self.latest.values()
                  for lvl, run in record.levels.items() if lvl == "full"
                  and (run.gpu_model or run.device) == model
                  for f in run.figures if f.name.startswith(INTERNODE_PREFIX)]
        return statistics.median(values) if len(values) >= 3 else None

    async def _test(self, group: Group, session: str, model: str) -> tuple[bool, str]:
        rdv = await self._rendezvous(session, list(group.nodes), "split search")
        self._arrived[session] = asyncio.Event()
        await self._ask(rdv, list(group.nodes), f"split search: {', '.join(group.members)}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + rdv.timeout_s + 60
        try:
            while len(self.shares.get(session, {})) < len(group.nodes) and not self.stopping:
                if any(_failed(s) for s in self.shares.get(session, {}).values()):
                    # The group failed already; a node that never joined will not report.
                    deadline = min(deadline, loop.time() + 5)
                left = deadline - loop.time()
                if left <= 0:
                    break
                self._arrived[session].clear()
                try:
                    await asyncio.wait_for(self._arrived[session].wait(), left)
                except TimeoutError:
                    break
        finally:
            del self._arrived[session]
        reports = {}
        for node, share in self.shares.pop(session, {}).items():
            ok = not _failed(share)
            bw = [f.value for f in share.data.figures if f.name.startswith(INTERNODE_PREFIX)]
            reports[node] = (ok, min(bw) if bw else None)
        return group_passed(reports, group.nodes, reference_gbps=self._reference_gbps(model),
                            min_fraction=self.config.current.full.min_pair_fraction)

    async def _fail(self, node: str, reason: str) -> None:
        """The coordinator's failing verdict on a node the search singled out."""
        last = self._last_run(node)
        await self.bus.publish(BenchResult(
            source=self.source, node=node, data=BenchResultData(
                level="full", passed=False, reason=reason, outcome="failed",
                device=last.device if last else "unknown",
                device_count=last.device_count if last else 0,
                gpu_model=last.gpu_model if last else "", duration_s=0.0, judged_by="coordinator",
                checks=[BenchCheck(name="inter_node_collectives", status="failed",
                                   detail=reason)])))

    async def search(self, request: SearchRequest) -> SearchReply:
        """Find the bad node(s) among ``nodes`` (a collective over them failed),
        using ``healthy`` (default: the nodes whose latest verdict is healthy)."""
        suspects = list(request.nodes)
        model, _ = self._model_and_ranks(suspects[0])
        healthy = request.healthy
        if healthy is None:
            healthy = [c.node for c in self._candidates() if c.outcome == "healthy"
                       and c.gpu_model == model and c.node not in suspects]
        self.searches += 1
        tag = f"search-{uuid.uuid4().hex[:8]}"
        run = SplitSearch.start(suspects, healthy)
        log: list[str] = []
        while not run.done and not self.stopping:
            groups = run.next_round()
            if not groups:
                break
            outcomes: dict[Group, bool] = {}
            for w, wave in enumerate(waves(groups)):
                results = await asyncio.gather(*(
                    self._test(g, f"{tag}-r{run.rounds}-w{w}-g{i}", model)
                    for i, g in enumerate(wave)))
                for group, (passed, why) in zip(wave, results, strict=True):
                    outcomes[group] = passed
                    log.append(f"round {run.rounds}: {'+'.join(group.nodes)} "
                               f"{'passed' if passed else 'failed'} ({why})")
            run.record(outcomes)
        self._log.info("split search done", bad=run.bad, rounds=run.rounds, tests=run.tests)
        for node in run.bad:  # seen twice: in the collective that failed and in the search
            await self._fail(node, f"split search ({tag}): fails multi-node collectives "
                                   f"with known-healthy partners; {log[-1] if log else ''}")
        return SearchReply(bad=run.bad, cleared=run.cleared,
                           inconclusive=[list(s) for s in run.inconclusive],
                           rounds=run.rounds, tests=run.tests, log=log)


def _failed(share: BenchResult) -> bool:
    return not any(c.name == "inter_node_collectives" and c.status == "ok"
                   for c in share.data.checks)
