"""Alerts on log lines (``services/lens_collector/log_alerts``): a rule opens
once per episode when ``count`` lines arrive within ``window_s``, closes
after ``clear_s`` of quiet, is about the job or (GPU hardware, RDMA) the
node, says whether the fault is the infrastructure's or the job's own, and
malformed rule files fail at load with the file, rule and field. Real error
lines from public logs (``fixtures/error_lines.yaml``) trigger their rule
and ordinary lines trigger none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.specs import SpecError
from services.lens_collector.log_alerts import LogAlerts, LogLine, LogRule, load_rules

FIXTURE = Path(__file__).parent / "fixtures/error_lines.yaml"
TIMEOUT = ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
           "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600049 "
           "milliseconds before timing out.")


def rule(**over: Any) -> LogRule:
    fields: dict[str, Any] = dict(name="boom", pattern="boom", fault_class="infra")
    return LogRule(**{**fields, **over})


def test_opens_once_per_episode_and_closes_after_quiet() -> None:
    alerts = LogAlerts([rule(count=2, window_s=10, clear_s=30)])
    line = LogLine(at=100.0, text="boom!", job="j1", node="n1", rank=3)
    assert alerts.observe(line) == []  # one is not enough
    assert alerts.observe(LogLine(at=120.0, text="boom", job="j1", node="n1")) == []  # too late
    [opened] = alerts.observe(LogLine(at=125.0, text="BOOM", job="j1", node="n1", rank=3))
    assert (opened.rule, opened.state, opened.key, opened.job) == ("log_boom", "open", "j1", "j1")
    assert opened.message.startswith("infra: boom (rank 3 on n1): BOOM")
    assert alerts.observe(LogLine(at=126.0, text="boom", job="j1")) == []  # same episode
    assert alerts.tick(140.0) == []  # quiet for 14 s only
    [closed] = alerts.tick(157.0)
    assert (closed.state, closed.alert_id) == ("closed", opened.alert_id)
    assert alerts.open_alerts() == []
    # Another job's lines are another key.
    assert alerts.observe(LogLine(at=160.0, text="boom", job="j2")) == []


def test_node_scope_and_lines_without_a_key() -> None:
    alerts = LogAlerts([rule(scope="node")])
    [opened] = alerts.observe(LogLine(at=1.0, text="boom", job="j1", node="n7"))
    assert (opened.key, opened.node, opened.job) == ("n7", "n7", None)
    assert alerts.observe(LogLine(at=1.0, text="boom", job="j1")) == []  # no node: nothing


def test_fault_class_of_an_alert() -> None:
    alerts = LogAlerts(load_rules())
    assert alerts.fault_class("log_collective_timeout") == "infra"
    assert alerts.fault_class("log_out_of_memory") == "user"
    assert alerts.fault_class("log_traceback") == "user"
    assert alerts.fault_class("gpu_temp_high") is None


def test_the_pytorch_watchdog_timeout_is_an_infra_alert() -> None:
    alerts = LogAlerts(load_rules())
    [opened] = alerts.observe(LogLine(at=1.0, text=TIMEOUT, job="j", node="n", rank=3))
    assert opened.rule == "log_collective_timeout" and opened.severity == "critical"


@pytest.mark.parametrize(("body", "says"), [
    ("rules: [{name: x, pattern: '(oops', fault_class: infra}]", "field 'rules.0.pattern'"),
    ("rules: [{name: x, pattern: a}]", "field 'rules.0.fault_class'"),
    ("rules: [{name: Bad-Name, pattern: a, fault_class: user}]", "field 'rules.0.name'"),
    ("rules: [{name: x, pattern: a, fault_class: user, count: 0}]", "field 'rules.0.count'"),
    ("rules: [{name: x, pattern: a, fault_class: user}, {name: x, pattern: b, "
     "fault_class: user}]", "rule names must be unique: x"),
])
def test_a_malformed_rule_fails_at_load(tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(body + "\n")
    with pytest.raises(SpecError) as err:
        load_rules(path)
    assert str(path) in str(err.value) and says in str(err.value), str(err.value)


def test_a_file_replaces_a_rule_by_name(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [{name: traceback, pattern: 'Traceback', fault_class: user, "
                    "count: 3}]\n")
    rules = {r.name: r for r in load_rules(path)}
    assert rules["traceback"].count == 3 and "collective_timeout" in rules


def fixture() -> dict[str, Any]:
    if not FIXTURE.exists():
        pytest.fail(f"{FIXTURE} is missing")
    return yaml.safe_load(FIXTURE.read_text())


def test_real_error_lines_trigger_their_rule() -> None:
    doc = fixture()
    rules = load_rules()
    for entry in doc["lines"]:
        alerts = LogAlerts(rules)
        opened = alerts.observe(LogLine(at=1.0, text=entry["text"], job="j", node="n"))
        assert entry["rule"] in {t.rule.removeprefix("log_") for t in opened}, entry


def test_ordinary_lines_trigger_nothing() -> None:
    rules = load_rules()
    for entry in fixture()["not_alerts"]:
        text = entry["text"] if isinstance(entry, dict) else entry
        assert LogAlerts(rules).observe(LogLine(at=1.0, text=text, job="j", node="n")) == [], \
            entry
