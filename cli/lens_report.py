"""A job's Lens report as one self-contained HTML file: the plots are PNGs
drawn with matplotlib and embedded as base64, so the file can be mailed or
attached to a ticket and opened anywhere. Pure: query results in, HTML out.
"""

from __future__ import annotations

import base64
import html
import io
import math
from datetime import datetime
from typing import Any

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}
img{max-width:100%;border:1px solid #eee}.crit{color:#b00}"""


def render(job: str, data: dict[str, Any]) -> str:
    """HTML for ``data`` as ``lens_verbs.fetch`` returns it for a report."""
    summary = data.get("summary") or {}
    series = data.get("series") or []
    throughput = data.get("throughput") or []
    checkpoints = data.get("checkpoints") or []
    parts = [f"<h1>Job {_e(job)}</h1>"]
    if not summary.get("samples"):
        parts.append("<p>Lens has no telemetry for this job.</p>")
    else:
        parts.append(_table([summary], list(summary), "Summary"))
        ckpt_iters = sorted({c["iteration"] for c in checkpoints})
        parts.append(_figure("Loss", _plot_xy(
            [r["iteration"] for r in series], [r["loss"] for r in series], "iteration", "loss",
            marks=ckpt_iters, mark_label="checkpoint")))
        if any(r.get("grad_norm") is not None for r in series):
            parts.append(_figure("Gradient norm", _plot_xy(
                [r["iteration"] for r in series], [r.get("grad_norm") for r in series],
                "iteration", "grad norm")))
        if throughput:
            times = [_time(r["t"]) for r in throughput]
            parts.append(_figure("Throughput", _plot_xy(
                times, [r["samples_per_s"] for r in throughput], "time", "samples/s (all ranks)")))
            parts.append(_figure("Step time", _plot_xy(
                times, [r["step_time_s"] for r in throughput], "time", "seconds per step")))
    parts.append(_table(checkpoints, ["iteration", "rank", "checkpoint_bytes",
                                      "checkpoint_duration_s", "checkpoint_path", "time"],
                        "Checkpoints"))
    parts.append(_table(data.get("alerts") or [], ["state", "severity", "rule", "subject",
                                                   "opened_at", "closed_at", "message"],
                        "Alerts"))
    parts.append(_table((data.get("timeline") or [])[:500],
                        ["time", "kind", "name", "node", "detail"], "Timeline"))
    generated = datetime.now().astimezone().isoformat(timespec="seconds")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Job {_e(job)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}"
            f"<p><small>primus-safe lens report, {generated}</small></p></body></html>")


def _plot_xy(xs: list[Any], ys: list[Any], xlabel: str, ylabel: str, *,
             marks: list[Any] | None = None, mark_label: str = "") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
    finite = [(x, y) for x, y in zip(xs, ys, strict=True)
              if isinstance(y, int | float) and math.isfinite(y)]
    bad = [x for x, y in zip(xs, ys, strict=True)
           if isinstance(y, float) and not math.isfinite(y)]
    if finite:
        ax.plot([x for x, _ in finite], [y for _, y in finite], linewidth=1.2)
    for i, x in enumerate(bad):
        ax.axvline(x, color="red", alpha=0.5, label="NaN/inf" if i == 0 else None)
    for i, x in enumerate(marks or []):
        ax.axvline(x, color="green", linestyle=":", alpha=0.6,
                   label=mark_label if i == 0 else None)
    if bad or marks:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _figure(title: str, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return f"<h2>{_e(title)}</h2><img alt='{_e(title)}' src='data:image/png;base64,{data}'>"


def _table(rows: list[dict[str, Any]], columns: list[str], title: str) -> str:
    if not rows:
        return f"<h2>{_e(title)}</h2><p>none</p>"
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td{_cls(r, c)}>{_e(_fmt(r.get(c)))}</td>" for c in columns) + "</tr>"
        for r in rows)
    return f"<h2>{_e(title)}</h2><table><tr>{head}</tr>{body}</table>"


def _cls(row: dict[str, Any], column: str) -> str:
    critical = row.get("severity") == "critical" and row.get("state") == "open"
    return " class='crit'" if critical and column in ("rule", "state") else ""


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _time(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)
