"""amd-smi XGMI link counters: parsed from a real 8x MI300X recording, then rated.

The fixture is ``amd-smi xgmi -m --json`` on an idle 8-GPU MI300X box (see
fixtures/README.md); every peer link carries 0 or 1 KB each way and each GPU's
link to itself is "N/A".
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from libs.gpu import (
    ToolOutputError,
    parse_amd_smi_xgmi_json,
    parse_amd_smi_xgmi_links,
    xgmi_rates,
)

FIXTURES = Path(__file__).parent / "fixtures"
KB = 1024


def fixture_text() -> str:
    return (FIXTURES / "amd_smi_xgmi_metric_mi300x8.json").read_text(encoding="utf-8")


def fixture_doc() -> list[dict]:
    return json.loads(fixture_text())


def test_mi300x_links_are_summed_per_gpu() -> None:
    totals = parse_amd_smi_xgmi_json(fixture_text())

    assert sorted(totals) == list(range(8))
    # Read/written KB per GPU, added up by hand from the recording.
    assert totals[0] == (7 * KB, 7 * KB)
    assert totals[2] == (4 * KB, 6 * KB)
    assert totals[5] == (2 * KB, 6 * KB)
    assert totals[7] == (0, 6 * KB)
    # The source repository's own test of this file expects read+write per GPU
    # of 14, 12, 10, 9, 9, 8, 6, 6 KB: an independent check of the sums.
    assert [sum(totals[i]) // KB for i in range(8)] == [14, 12, 10, 9, 9, 8, 6, 6]


@pytest.mark.parametrize(
    "wrap",
    [
        lambda gpus: {"xgmi_metric": gpus},
        lambda gpus: {"xgmi_metric": [gpus]},  # one list per command run
    ],
    ids=["wrapped", "wrapped-nested"],
)
def test_newer_wrapped_documents_read_the_same(wrap: Callable[[list], object]) -> None:
    expected = parse_amd_smi_xgmi_json(fixture_text())

    assert parse_amd_smi_xgmi_json(json.dumps(wrap(fixture_doc()))) == expected


def test_a_warning_line_before_the_json_is_skipped() -> None:
    text = "WARNING: User is missing the following required groups: render\n" + fixture_text()

    assert parse_amd_smi_xgmi_json(text)[0] == (7 * KB, 7 * KB)


def test_units_other_than_kb_and_bare_or_text_values() -> None:
    doc = fixture_doc()[:1]
    links = doc[0]["link_metrics"]["links"]
    links[1]["read"] = {"value": 1.5, "unit": "MB"}
    links[2]["read"] = "2 GB"
    links[3]["read"] = 3  # a bare number is KB, the library's unit
    links[4]["read"] = {"value": 1, "unit": "TB"}

    read, _ = parse_amd_smi_xgmi_json(json.dumps(doc))[0]

    assert read == int(1.5 * KB**2) + 2 * KB**3 + 3 * KB + KB**4 + 3 * KB  # + links 5..7


def test_a_node_without_xgmi_reports_nothing() -> None:
    doc = fixture_doc()
    for gpu in doc:
        for link in gpu["link_metrics"]["links"]:
            link["read"] = link["write"] = "N/A"
    doc[1]["link_metrics"] = "N/A"

    assert parse_amd_smi_xgmi_json(json.dumps(doc)) == {}


def broken(change: Callable[[list], object]) -> str:
    doc = copy.deepcopy(fixture_doc())
    change(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (fixture_text()[:5000], "not JSON"),
        ("", "no output"),
        ("Xgmi metric is not supported on this device\n", "not JSON"),
        (json.dumps({"gpu_data": []}), "expected a list of GPUs"),
        (broken(lambda d: d[3].pop("gpu")), "entry 3 has no 'gpu' index"),
        (broken(lambda d: d.append(d[0])), "index 0 appears twice"),
        (broken(lambda d: d[0]["link_metrics"].update(links={})), "expected a list"),
        (broken(lambda d: d[2]["link_metrics"]["links"].__setitem__(4, "x")), "link 4 is str"),
        (
            broken(lambda d: d[1]["link_metrics"]["links"][0].update(read={"value": "lots"})),
            "GPU 1 link 0 read",
        ),
        (
            broken(lambda d: d[1]["link_metrics"]["links"][0].update(write={"unit": "KB"})),
            "GPU 1 link 0 write has no 'value'",
        ),
        (
            broken(lambda d: d[0]["link_metrics"]["links"][1].update(read={"value": -4})),
            "negative",
        ),
        (
            broken(
                lambda d: d[0]["link_metrics"]["links"][1].update(
                    read={"value": 4, "unit": "furlongs"}
                )
            ),
            "unknown memory unit",
        ),
    ],
    ids=[
        "truncated",
        "empty",
        "not-supported-text",
        "wrong-wrapper",
        "no-index",
        "duplicate",
        "links-not-list",
        "link-not-object",
        "non-numeric",
        "no-value",
        "negative",
        "unknown-unit",
    ],
)
def test_unexpected_shapes_raise_tool_output_error(text: str, says: str) -> None:
    with pytest.raises(ToolOutputError) as caught:
        parse_amd_smi_xgmi_json(text)

    assert caught.value.tool == "amd-smi"
    assert says in str(caught.value)


def test_rates_are_bytes_per_second_between_two_readings() -> None:
    before = {0: (1_000, 2_000), 1: (5_000, 5_000)}
    after = {0: (9_000, 2_000), 1: (5_000, 11_000)}

    assert xgmi_rates(before, after, elapsed_s=2.0) == {0: (4_000.0, 0.0), 1: (0.0, 3_000.0)}


def test_no_rate_without_an_earlier_reading_or_elapsed_time() -> None:
    assert xgmi_rates({}, {0: (10, 10)}, elapsed_s=1.0) == {0: None}
    assert xgmi_rates({0: (1, 1)}, {0: (10, 10)}, elapsed_s=0.0) == {0: None}


def test_a_counter_that_went_backwards_gives_no_rate() -> None:
    before = {0: (10_000, 10_000), 1: (10_000, 10_000)}
    after = {0: (50, 20_000), 1: (20_000, 20_000)}  # GPU 0 was reset

    assert xgmi_rates(before, after, elapsed_s=1.0) == {0: None, 1: (10_000.0, 10_000.0)}


# ------------------------------------------------------------------ link rates


def test_mi300x_link_rates_and_peers() -> None:
    links = parse_amd_smi_xgmi_links(fixture_text())

    assert sorted(links) == list(range(8))
    for index, gpu in links.items():
        # 32 Gb/s per lane, 16 lanes: 512 Gb/s (64 GB/s) per link and direction.
        assert (gpu.bit_rate_gbps, gpu.link_gbps) == (32.0, 512.0)
        assert gpu.peers == tuple(i for i in range(8) if i != index)  # a full mesh
    assert links[5].bdf == "0000:af:00.0"


def test_a_peer_whose_counters_read_na_is_no_link() -> None:
    doc = fixture_doc()
    # Changed from the recording: GPU 5's entry for GPU 6 as a link that is down.
    doc[5]["link_metrics"]["links"][6]["read"] = "N/A"
    doc[5]["link_metrics"]["links"][6]["write"] = "N/A"

    assert parse_amd_smi_xgmi_links(json.dumps(doc))[5].peers == (0, 1, 2, 3, 4, 7)


def test_link_rates_in_other_units_and_a_gpu_without_xgmi() -> None:
    doc = fixture_doc()[:3]
    doc[0]["link_metrics"]["max_bandwidth"] = {"value": 64, "unit": "GB/s"}  # bytes
    doc[1]["link_metrics"]["max_bandwidth"] = {"value": 512000, "unit": "Mb/s"}
    doc[2]["link_metrics"] = "N/A"

    links = parse_amd_smi_xgmi_links(json.dumps({"xgmi_metric": [doc]}))

    assert links[0].link_gbps == 512.0 and links[1].link_gbps == 512.0
    assert sorted(links) == [0, 1]


def test_a_rate_in_an_unknown_unit_is_refused() -> None:
    doc = fixture_doc()[:1]
    doc[0]["link_metrics"]["max_bandwidth"] = {"value": 512, "unit": "furlongs"}

    with pytest.raises(ToolOutputError, match="max_bandwidth has unit 'furlongs'"):
        parse_amd_smi_xgmi_links(json.dumps(doc))
