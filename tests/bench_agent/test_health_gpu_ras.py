"""GPU RAS probe: parsers on recorded nvidia-smi and amd-smi outputs, and the
probe on a fake tree and runner (ok, failed per GPU, not applicable, unknown)
and on this machine."""

from __future__ import annotations

import json
from pathlib import Path

from services.bench.health import gpu_ras
from services.bench.health.base import ProbeContext, ToolOutput, ToolUnavailable

FIX = Path(__file__).parent / "fixtures" / "health"
GPU_FIX = Path(__file__).parents[1] / "gpu" / "fixtures"  # shared with tests/gpu (cited there)

A10G = (FIX / "nvidia_smi_q_x_a10g.xml").read_text()
T4 = (GPU_FIX / "nvidia_smi_q_x_tesla_t4.xml").read_text()
A100 = (GPU_FIX / "nvidia_smi_q_x_a100_sxm4.xml").read_text()
H200 = (GPU_FIX / "nvidia_smi_q_x_h200.xml").read_text()
RX6600_METRIC = (GPU_FIX / "amd_smi_metric_rx6600.json").read_text()

# No real `amd-smi bad-pages --json` capture was found (README: not covered).
# These follow the shape amdsmi_cli/amdsmi_commands.py (ROCm/amdsmi) prints:
# per GPU "retired"/"pending"/"un_res", each "No bad pages found.", one page
# object or a list of them. Built here, not recorded.
NONE = "No bad pages found."
PAGE = {"page_address": "0x7fc6f5000", "page_size": 4096, "status": "RESERVED"}


def bad_pages(**per_gpu) -> str:
    return json.dumps(
        [
            {"gpu": int(g[3:]), "retired": NONE, "pending": NONE, "un_res": NONE, **v}
            for g, v in per_gpu.items()
        ]
    )


def test_nvidia_a10g_remapped_rows_and_ecc():
    gpus = gpu_ras.parse_nvidia_xml(A10G)
    ras = gpus["00000000:00:1E.0"]
    assert (ras.retired, ras.pending, ras.uncorrectable) == (None, None, 0)
    assert not ras.remap_pending and not ras.remap_failure


def test_nvidia_t4_retired_pages_and_a100_na():
    (t4,) = gpu_ras.parse_nvidia_xml(T4).values()
    assert t4.retired == 0 and t4.pending == 0
    (a100,) = gpu_ras.parse_nvidia_xml(A100).values()
    assert a100.retired is None and a100.uncorrectable == 0


def test_nvidia_h200_remaps_rows_and_has_no_retired_page_count():
    (h200,) = gpu_ras.parse_nvidia_xml(H200).values()
    assert h200.gpu == "00000000:00:06.0"
    assert (h200.retired, h200.pending, h200.uncorrectable) == (None, None, 0)
    assert not h200.remap_pending and not h200.remap_failure


def test_amd_metric_ecc_rx6600():
    (ras,) = gpu_ras.parse_amd_ecc(RX6600_METRIC).values()
    assert ras.gpu == "0" and ras.uncorrectable == 0 and ras.blocks == {}


def test_amd_bad_pages_counts():
    gpus = gpu_ras.parse_amd_bad_pages(
        bad_pages(gpu0={}, gpu1={"retired": [PAGE, PAGE], "pending": PAGE})
    )
    assert (gpus["0"].retired, gpus["0"].pending) == (0, 0)
    assert (gpus["1"].retired, gpus["1"].pending, gpus["1"].unreservable) == (2, 1, 0)


def test_judge_names_each_problem():
    gpus = {"3": gpu_ras.GpuRas("3", retired=70, pending=2, uncorrectable=5, remap_failure=True)}
    problems = gpu_ras.judge(gpus, {"3": 4}, max_bad_pages=64)
    assert problems == [
        "GPU 3: 2 page(s) pending retirement",
        "GPU 3: row remapping failed",
        "GPU 3: 70 bad pages (over 64)",
        "GPU 3: uncorrectable ECC errors grew 4 -> 5",
    ]


class Runner:
    def __init__(self, answers):
        self.answers = answers

    def __call__(self, argv, timeout_s):
        key = " ".join(argv)
        answer = self.answers.get(key, self.answers.get(argv[0]))
        if answer is None:
            raise ToolUnavailable(f"{argv[0]}: not installed")
        if isinstance(answer, Exception):
            raise answer
        return answer if isinstance(answer, ToolOutput) else ToolOutput(0, answer, "")


def amd_tree(tmp_path: Path) -> Path:
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    return tmp_path


def nvidia_tree(tmp_path: Path) -> Path:
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    return tmp_path


def amd_runner(pages: str, metric: str = RX6600_METRIC) -> Runner:
    return Runner(
        {"amd-smi bad-pages --json": pages, "amd-smi metric --ecc --ecc-blocks --json": metric}
    )


def test_amd_ok(tmp_path):
    found = gpu_ras.probe(ProbeContext(root=amd_tree(tmp_path), run=amd_runner(bad_pages(gpu0={}))))
    assert found.status == "ok", found


def test_amd_pending_page_fails_naming_gpu(tmp_path):
    run = amd_runner(bad_pages(gpu0={"pending": PAGE}))
    found = gpu_ras.probe(ProbeContext(root=amd_tree(tmp_path), run=run))
    assert found.status == "failed" and "GPU 0: 1 page(s) pending retirement" in found.detail


def test_amd_bad_pages_over_threshold(tmp_path):
    run = amd_runner(bad_pages(gpu0={"retired": [PAGE] * 3}))
    found = gpu_ras.probe(
        ProbeContext(root=amd_tree(tmp_path), run=run, options={"max_bad_pages": 2})
    )
    assert found.status == "failed" and "3 bad pages (over 2)" in found.detail


def test_uncorrectable_growth_between_probes(tmp_path):
    root, state = amd_tree(tmp_path), {}
    grown = RX6600_METRIC.replace(
        '"total_uncorrectable_count": 0', '"total_uncorrectable_count": 2'
    )
    assert grown != RX6600_METRIC
    assert (
        gpu_ras.probe(
            ProbeContext(root=root, run=amd_runner(bad_pages(gpu0={})), state=state)
        ).status
        == "ok"
    )
    found = gpu_ras.probe(
        ProbeContext(root=root, run=amd_runner(bad_pages(gpu0={}), grown), state=state)
    )
    assert found.status == "failed" and "grew 0 -> 2" in found.detail
    again = gpu_ras.probe(
        ProbeContext(root=root, run=amd_runner(bad_pages(gpu0={}), grown), state=state)
    )
    assert again.status == "ok"


def test_nvidia_ok_and_remap_failure(tmp_path):
    root = nvidia_tree(tmp_path)
    assert gpu_ras.probe(ProbeContext(root=root, run=Runner({"nvidia-smi": A10G}))).status == "ok"
    bad = A10G.replace("<remapped_row_failure>No<", "<remapped_row_failure>Yes<")
    found = gpu_ras.probe(ProbeContext(root=root, run=Runner({"nvidia-smi": bad})))
    assert found.status == "failed" and "GPU 00000000:00:1E.0: row remapping failed" in found.detail


def test_not_applicable_without_driver(tmp_path):
    assert gpu_ras.probe(ProbeContext(root=tmp_path, run=Runner({}))).status == "not_applicable"


def test_tool_missing_timeout_error_garbage_unknown(tmp_path):
    root = nvidia_tree(tmp_path)
    cases = {
        "not installed": Runner({}),
        "no answer": Runner({"nvidia-smi": ToolUnavailable("nvidia-smi: no answer within 30 s")}),
        "exit 9": Runner({"nvidia-smi": ToolOutput(9, "", "NVIDIA-SMI has failed")}),
        "unparseable": Runner({"nvidia-smi": "No devices were found"}),
    }
    for reason, run in cases.items():
        found = gpu_ras.probe(ProbeContext(root=root, run=run))
        assert found.status == "unknown" and reason in found.detail, (reason, found)
    found = gpu_ras.probe(ProbeContext(root=amd_tree(tmp_path / "a"), run=amd_runner("[{]")))
    assert found.status == "unknown" and "unparseable" in found.detail


def test_on_this_machine():
    assert gpu_ras.probe(ProbeContext()).status != "failed"
