"""Listing tables: aligned, nothing ever cut short, one row per line."""

from __future__ import annotations

import pytest

from cli.output import format_table, print_rows


def test_a_table_keeps_every_cell_whole_and_aligned() -> None:
    rows = [{"job": "tiny-ddp-773a63", "status": "completed", "nodes": ["node-1", "node-2"],
             "reason": "rank 1 on node-2\nexited with code 1"},
            {"job": "j", "status": "pending", "nodes": [], "reason": None}]
    lines = format_table(rows, ["job", "status", "nodes", "reason"]).splitlines()
    assert lines[0].split() == ["JOB", "STATUS", "NODES", "REASON"]
    assert lines[1].split()[:3] == ["tiny-ddp-773a63", "completed", "node-1,node-2"]
    assert lines[1].endswith("rank 1 on node-2 exited with code 1")  # one line per row
    assert lines[0].index("STATUS") == lines[1].index("completed") == lines[2].index("pending")
    assert lines[2].rstrip() == lines[2]


def test_output_name_prints_one_id_per_line_and_empty_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"job": "a-1", "status": "running"}, {"job": "b-2", "status": "pending"}]
    print_rows(rows, False, ["job", "status"], "jobs", output="name")
    assert capsys.readouterr().out == "a-1\nb-2\n"
    print_rows(rows, False, ["job"], "jobs", output="wide", wide=["status"])
    assert "STATUS" in capsys.readouterr().out
    print_rows([], False, ["job"], "jobs")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "No jobs found.\n"
