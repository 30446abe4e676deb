"""The benchmarks' own logic: trace loading and a tiny replay of each policy."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from services.scheduler.policy import Node
from tests.helpers import load_bench

trace = load_bench("scheduler_trace")
scale = load_bench("scheduler_scale")

POD_HEADER = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
              "pod_phase", "creation_time", "deletion_time", "scheduled_time"]


def _write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_trace_keeps_whole_gpu_tasks_and_maps_qos(tmp_path: Path) -> None:
    pods = _write(tmp_path / "x_pod_list_default.csv", POD_HEADER, [
        ["p-whole", 1, 1, 1, 1000, "", "LS", "Running", 100, 500, 100],
        ["p-share", 1, 1, 1, 460, "", "LS", "Running", 100, 500, 100],
        ["p-cpu", 1, 1, 0, 0, "", "BE", "Running", 100, 500, 100],
        ["p-multi", 1, 1, 2, 500, "V100M16|V100M32", "Burstable", "Running", 200, 900, 250],
        ["p-never", 1, 1, 4, 1000, "", "BE", "Pending", 300, 400, ""],
        ["p-be", 1, 1, 8, 1000, "", "BE", "Failed", 300, 400, 300],
    ])
    tasks, skipped = trace.load_tasks(pods, speedup=10, min_runtime_s=60)
    by = {t.job.id: t for t in tasks}
    assert set(by) == {"p-whole", "p-multi", "p-be"}
    assert skipped["fractional_or_cpu"] == 2 and skipped["never_scheduled"] == 1
    assert by["p-whole"].job.priority == "high" and not by["p-whole"].job.preemptible
    assert by["p-multi"].job.priority == "medium"
    assert by["p-multi"].job.gpu_models == {"V100M16", "V100M32"}
    assert by["p-multi"].arrival == 10.0 and by["p-multi"].duration == 650.0
    assert by["p-be"].job.priority == "low" and by["p-be"].job.gpus_per_worker == 8


def test_a_pod_list_without_times_borrows_them_by_name(tmp_path: Path) -> None:
    _write(tmp_path / "x_pod_list_default.csv", POD_HEADER, [
        ["p0", 1, 1, 1, 1000, "", "BE", "Running", 0, 50, 0],
        ["p1", 1, 1, 1, 1000, "", "LS", "Running", 40, 90, 40],
    ])
    pods = _write(tmp_path / "x_pod_list_multigpu50.csv", POD_HEADER[:5], [
        ["p0", 1, 1, 4, 1000], ["p1", 1, 1, 2, 1000], ["p-new", 1, 1, 8, 1000]])
    tasks, skipped = trace.load_tasks(pods, speedup=1, min_runtime_s=0)
    assert skipped["borrowed_times_and_qos"] == 3
    by = {t.job.id: t for t in tasks}
    assert by["p0"].job.gpus_per_worker == 4 and by["p0"].job.priority == "low"
    assert by["p1"].arrival == 40.0 and by["p1"].job.priority == "high"
    assert by["p-new"].job.gpus_per_worker == 8


def test_racks_are_synthesised_from_sorted_names(tmp_path: Path) -> None:
    nodes_csv = _write(tmp_path / "nodes.csv", ["sn", "cpu_milli", "memory_mib", "gpu", "model"],
                       [[f"node-{i:02d}", 1, 1, 8, "G2"] for i in reversed(range(10))])
    nodes = trace.load_nodes(nodes_csv, rack_size=4, fraction=1.0)
    assert [n.rack for n in nodes] == ["rack000"] * 4 + ["rack001"] * 4 + ["rack002"] * 2
    assert nodes[0].name == "node-00" and nodes[5].ip == "10.0.1.2"


def _tiny_cluster(tmp_path: Path) -> tuple[list[Node], Path]:
    """Two 8-GPU nodes and six tasks asking 31 GPUs within a minute."""
    nodes = [Node(f"n{i}", 8, "G2", rack="r0", ip=f"10.0.0.{i + 1}") for i in range(2)]
    pods = _write(tmp_path / "x_pod_list_default.csv", POD_HEADER, [
        [f"p{k}", 1, 1, g, 1000, "", q, "Running", 10 * k, 10 * k + 300, 10 * k]
        for k, (g, q) in enumerate([(8, "BE"), (8, "BE"), (4, "LS"), (2, "Burstable"),
                                    (8, "LS"), (1, "BE")])])
    return nodes, pods


def test_tiny_replay_runs_every_task_under_both_policies(tmp_path: Path) -> None:
    nodes, pods = _tiny_cluster(tmp_path)
    tasks, _ = trace.load_tasks(pods, speedup=1, min_runtime_s=0)
    for policy in (True, False):
        m = trace.replay(nodes, tasks, policy=policy, cycle_s=10)
        fig = trace.summarise(m, tasks)
        assert fig["unstarted"] == 0
        assert 0 < fig["mean_allocation"] <= 1
    assert trace.replay(nodes, tasks, policy=True, cycle_s=10).preemptions > 0


def test_scale_bench_measures_both_schedulers() -> None:
    nodes = scale.build_cluster(4, 8, switches=2, seed=1)
    pending = scale.make_jobs(200, seed=2, prefix="j-", now=1000.0, nodes=nodes)
    snap = scale.Snapshot(nodes, scale.WORKSPACES, (), pending)
    fig, base = scale.run_policy(snap, 1000.0), scale.run_baseline(snap)
    assert fig["decisions"] == base["decisions"] == 200
    assert fig["placed"] > 0 and base["placed"] > 0
    assert fig["p99_ms"] >= fig["p50_ms"] > 0


def test_scale_bench_repeats_the_spot_node_shapes_and_refuses_a_bad_list(tmp_path: Path) -> None:
    good = tmp_path / "nodes.csv"
    good.write_text("gpu_model,gpu_capacity_num,cpu_num,node_name\n"
                    "A10,1,128,0\nH800,8,128,1\nGPU-series-1,4,96,2\n")
    nodes = scale.spot_cluster(good, gpus=26, per_rack=4, switches=2, seed=1)
    assert len(nodes) == 6 and sum(n.gpus for n in nodes) == 26  # two copies of 13 GPUs
    assert [n.gpus for n in nodes] == [1, 8, 4, 1, 8, 4]
    assert len({n.name for n in nodes}) == 6
    assert [n.rack for n in nodes] == ["r0000"] * 4 + ["r0001"] * 2
    pending = scale.make_jobs(300, seed=2, prefix="j-", now=1000.0, nodes=nodes,
                              pins=("A10", "H800"))
    assert {m for j in pending for m in j.gpu_models} == {"A10", "H800"}
    # The pins only name the models: the same seed draws the same jobs.
    plain = scale.make_jobs(300, seed=2, prefix="j-", now=1000.0, nodes=nodes)
    assert [(j.gpus, j.priority) for j in plain] == [(j.gpus, j.priority) for j in pending]
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu_model,gpus,node_name\nA10,1,0\n")
    with pytest.raises(SystemExit, match=r"bad.csv: no column gpu_capacity_num"):
        scale.spot_cluster(bad, gpus=10, per_rack=4, switches=2, seed=1)
    bad.write_text("gpu_model,gpu_capacity_num,node_name\nA10,one,0\n")
    with pytest.raises(SystemExit, match=r"bad.csv:2: gpu_capacity_num='one'"):
        scale.spot_cluster(bad, gpus=10, per_rack=4, switches=2, seed=1)


def test_best_fit_takes_the_tightest_node_that_holds_the_worker() -> None:
    from services.scheduler.policy import Job
    from services.scheduler.policy.baseline import BestFit, FirstFit

    nodes = [Node(name, 8, "G2", rack="r0", ip=f"10.0.0.{i + 1}")
             for i, name in enumerate(["a", "b", "c"])]
    best, first = BestFit(nodes), FirstFit(nodes)
    for ff in (best, first):  # a: 2 free, b: 8 free, c: 5 free
        ff.free[:] = [2, 8, 5]
        ff.total_free = 15
    job = Job("j", "w", 1, 4, "medium", 0.0)
    assert first.decide(job) == (("b", 4),)  # the first that holds it
    assert best.decide(job) == (("c", 4),)  # the one it leaves least free on
    two = Job("k", "w", 2, 2, "medium", 0.0)
    # a fits one worker exactly; c has 1 left now, so the second goes to b.
    assert best.decide(two) == (("a", 2), ("b", 2))
    assert best.decide(Job("x", "w", 1, 8, "medium", 0.0)) is None  # b has 6 left
    assert best.decide(Job("y", "w", 1, 6, "medium", 0.0)) == (("b", 6),)


def test_the_figures_that_separate_policies(tmp_path: Path) -> None:
    nodes, pods = _tiny_cluster(tmp_path)
    tasks, _ = trace.load_tasks(pods, speedup=1, min_runtime_s=0)
    loaded, _ = trace.load_tasks(pods, speedup=1, min_runtime_s=0, load=2)
    assert [t.arrival for t in loaded] == [t.arrival / 2 for t in tasks]
    for name in trace.SCHEDULERS:
        m = trace.replay(nodes, tasks, policy=name, cycle_s=10)
        fig = trace.summarise(m, tasks)
        assert fig["unstarted"] == 0 and set(m.finished) == {t.job.id for t in tasks}
        # Tasks queue here (16 GPUs, 31 asked within a minute): the contended
        # window is part of the arrival window, and no fuller than the peak.
        assert 0 < fig["contended_share"] <= 1
        assert fig["contended_allocation"] <= fig["peak_allocation"]
        assert 0 <= fig["contended_stranded_free"] <= 1
        waits = {t.job.id: m.started[t.job.id] - t.arrival for t in tasks}
        weighted = sum(waits[t.job.id] * t.job.gpus_per_worker for t in tasks) / 31
        assert abs(fig["gpu_weighted_mean_wait_s"] - weighted) < 1e-9
        assert fig["8gpu_tasks"] == 3 and fig["1gpu_tasks"] == 1 and fig["2-4gpu_tasks"] == 2
        # A task completes its run time (300 s) after it started.
        assert fig["1gpu_mean_jct_s"] == waits["p5"] + 300
        # Only the policy holds GPUs for a blocked head (an 8-GPU task here);
        # as a share of all GPUs that is at most its share of the free ones.
        if name == "policy":
            assert 0 < fig["reserved_idle_share"] <= fig["mean_reserved_free"]
        else:
            assert fig["reserved_idle_share"] == fig["mean_reserved_free"] == 0


def test_shared_contention_weighs_only_the_stretch_every_run_queues() -> None:
    # (time, allocated, stranded share, queue length, reserved, reserved idle)
    a, b = trace.Metrics(), trace.Metrics()
    a.samples = [(0.0, 0.2, 0.1, 0, 0, 0), (10.0, 0.9, 0.5, 3, 0, 0),
                 (20.0, 0.4, 0.3, 0, 0, 0), (40.0, 0.0, 0.0, 0, 0, 0)]
    b.samples = [(0.0, 0.3, 0.2, 2, 0, 0), (15.0, 0.8, 0.6, 1, 0, 0),
                 (30.0, 0.1, 0.0, 0, 0, 0), (40.0, 0.0, 0.0, 0, 0, 0)]
    shared = trace.shared_contention({"a": a, "b": b}, 40.0)
    # Both queue in [10, 20): a at 0.9 / 0.5 throughout, b at 0.3 / 0.2 for
    # 5 s, then 0.8 / 0.6 for 5 s.
    assert shared["a"]["shared_contended_share"] == shared["b"]["shared_contended_share"] == 0.25
    assert shared["a"]["shared_contended_allocation"] == pytest.approx(0.9)
    assert shared["a"]["shared_contended_stranded_free"] == pytest.approx(0.5)
    assert shared["b"]["shared_contended_allocation"] == pytest.approx(0.55)
    assert shared["b"]["shared_contended_stranded_free"] == pytest.approx(0.4)
    # Never queued at the same time: nothing to compare.
    b.samples = [(0.0, 0.3, 0.2, 2, 0, 0), (10.0, 0.1, 0.0, 0, 0, 0), (40.0, 0.0, 0.0, 0, 0, 0)]
    none = trace.shared_contention({"a": a, "b": b}, 40.0)
    assert none["a"]["shared_contended_share"] == 0.0
    assert none["a"]["shared_contended_stranded_free"] is None


def test_the_scheduling_window_runs_to_the_last_start(tmp_path: Path) -> None:
    nodes, pods = _tiny_cluster(tmp_path)
    tasks, _ = trace.load_tasks(pods, speedup=1, min_runtime_s=0)
    m = trace.replay(nodes, tasks, policy="fifo first-fit", cycle_s=10)
    # 31 GPUs asked of 16 within a minute: the last task starts after the
    # last arrival (50 s), once the first ones end (300 s).
    assert trace.scheduling_window(m, tasks) == max(m.started.values()) >= 300
    assert trace.summarise(m, tasks)["window_s"] == trace.scheduling_window(m, tasks)
    assert trace.summarise(m, tasks, 100.0)["window_s"] == 100.0


def _figures(**kw: float) -> dict[str, float]:
    base = {"contended_allocation": 0.8, "high_mean_wait_s": 100.0, "high_p99_wait_s": 900.0,
            "gpu_weighted_mean_wait_s": 200.0, "8gpu_mean_wait_s": 400.0,
            "reserved_idle_share": 0.0, "contended_stranded_free": 0.2}
    return {**base, **kw}


def test_goals_compare_against_the_better_baseline() -> None:
    ff, bf = _figures(), _figures(contended_allocation=0.85, high_mean_wait_s=90.0)
    met = trace.goals(_figures(contended_allocation=0.85, high_mean_wait_s=90.0,
                               gpu_weighted_mean_wait_s=219.0, **{"8gpu_mean_wait_s": 499.0},
                               reserved_idle_share=0.02, contended_stranded_free=0.19), ff, bf)
    assert all(met.values()), met
    missed = trace.goals(_figures(contended_allocation=0.84, high_mean_wait_s=95.0,
                                  gpu_weighted_mean_wait_s=221.0,
                                  **{"8gpu_mean_wait_s": 501.0}, reserved_idle_share=0.021,
                                  contended_stranded_free=0.2), ff, bf)
    assert not any(v for k, v in missed.items() if k != "high_p99_wait_s"), missed
    assert set(met) == set(trace.GOALS)


def test_a_policy_under_which_nothing_queued_meets_the_contended_goals() -> None:
    # With every node of a trace kept, the policy may start every task at
    # once while a baseline queues a few: it left nothing idle or stranded
    # while something waited. The other way round (the wait goals say what
    # queueing cost), GPUs it stranded while tasks queued miss the goal.
    idle = {"contended_allocation": None, "contended_stranded_free": None}
    ff, bf = _figures(), _figures(**idle)
    met = trace.goals(_figures(**idle), ff, bf)
    assert met["contended_allocation"] and met["contended_stranded_free"]
    missed = trace.goals(_figures(contended_allocation=0.5), _figures(**idle),
                         _figures(**idle))
    assert missed["contended_allocation"]  # no baseline allocation to fall behind
    assert not missed["contended_stranded_free"]  # 0.2 stranded against none


def test_the_table_marks_each_missed_goal() -> None:
    run = {"trace": "default", "load": 2.0, "policy": _figures(), "fifo_first_fit": _figures(),
           "fifo_best_fit": _figures(contended_allocation=0.9)}
    run["goals"] = trace.goals(run["policy"], run["fifo_first_fit"], run["fifo_best_fit"])
    text = trace.table([run])
    row = text.splitlines()[2]
    assert row.startswith("| default | 2 | 0.800 / 0.800 / 0.900 ✗ |")
    assert row.count("✗") == sum(not v for v in run["goals"].values()) == 2  # + stranded (equal)


# -- bad trace files: one error naming the file, the line or column, the fix --

NODE_HEADER = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]


def _error(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except trace.TraceError as e:
        return str(e)
    raise AssertionError("no TraceError")


def test_a_pod_list_without_a_needed_column_is_refused_by_name(tmp_path: Path) -> None:
    pods = _write(tmp_path / "x_pod_list_default.csv", ["name", "gpu_milli", "creation_time"],
                  [["p0", 1000, 0]])
    msg = _error(lambda: trace.load_tasks(pods, speedup=1, min_runtime_s=0))
    assert msg.startswith(f"{pods}: no column num_gpu") and "pod list" in msg
    half = _write(tmp_path / "y_pod_list_default.csv", POD_HEADER[:9], [["p0", 1, 1, 1, 1000,
                                                                         "", "LS", "R", 0]])
    msg = _error(lambda: trace.load_tasks(half, speedup=1, min_runtime_s=0))
    assert "deletion_time, scheduled_time" in msg and "all of" in msg


def test_a_bad_cell_names_its_line_and_column(tmp_path: Path) -> None:
    rows = [["p0", 1, 1, 1, 1000, "", "LS", "Running", 0, 50, 0],
            ["p1", 1, 1, "two", 1000, "", "LS", "Running", 5, 50, 5]]
    pods = _write(tmp_path / "x_pod_list_default.csv", POD_HEADER, rows)
    msg = _error(lambda: trace.load_tasks(pods, speedup=1, min_runtime_s=0))
    assert msg.startswith(f"{pods}:3: num_gpu='two' is not a whole number")
    rows[1][3], rows[1][8] = 1, "soon"
    _write(pods, POD_HEADER, rows)
    msg = _error(lambda: trace.load_tasks(pods, speedup=1, min_runtime_s=0))
    assert msg.startswith(f"{pods}:3: creation_time='soon'")
    rows[1][8] = "inf"  # a time that never comes would stall the replay
    _write(pods, POD_HEADER, rows)
    msg = _error(lambda: trace.load_tasks(pods, speedup=1, min_runtime_s=0))
    assert msg.startswith(f"{pods}:3: creation_time='inf' is not a finite number")
    rows[1][8] = 5
    _write(pods, POD_HEADER, [*rows, rows[0]])
    msg = _error(lambda: trace.load_tasks(pods, speedup=1, min_runtime_s=0))
    assert msg.startswith(f"{pods}:4: pod p0 is listed again (first on line 2)")


def test_a_resample_without_its_default_list_says_which_file_it_needs(tmp_path: Path) -> None:
    pods = _write(tmp_path / "x_pod_list_multigpu50.csv", POD_HEADER[:5], [["p0", 1, 1, 4, 1000]])
    msg = _error(lambda: trace.load_tasks(pods, speedup=1, min_runtime_s=0))
    assert "x_pod_list_default.csv next to it" in msg
    donor = _write(tmp_path / "x_pod_list_default.csv", POD_HEADER, [])
    msg = _error(lambda: trace.load_tasks(pods, speedup=1, min_runtime_s=0))
    assert msg.startswith(f"{donor}: no pods to borrow times from")


def test_a_trace_with_nothing_to_replay_is_refused(tmp_path: Path) -> None:
    pods = _write(tmp_path / "x_pod_list_default.csv", POD_HEADER,
                  [["p-share", 1, 1, 1, 460, "", "LS", "Running", 0, 50, 0]])
    assert "no whole-GPU task" in _error(lambda: trace.load_tasks(pods, speedup=1,
                                                                  min_runtime_s=0))
    nodes = _write(tmp_path / "nodes.csv", NODE_HEADER, [["n0", 1, 1, 8, "G2"],
                                                         ["n0", 1, 1, 8, "G2"]])
    msg = _error(lambda: trace.load_nodes(nodes, rack_size=4, fraction=1.0))
    assert msg.startswith(f"{nodes}:3: node n0 is listed again")
    assert "no such file" in _error(lambda: trace.load_nodes(tmp_path / "gone.csv",
                                                             rack_size=4, fraction=1.0))


def test_tasks_no_node_could_hold_are_left_out_and_counted(tmp_path: Path) -> None:
    nodes, pods = _tiny_cluster(tmp_path)  # two 8-GPU G2 nodes
    tasks, _ = trace.load_tasks(pods, speedup=1, min_runtime_s=0)
    pinned = trace.Task(replace(tasks[0].job, id="on-a100", gpu_models=frozenset({"A100"})),
                        0.0, 10.0)
    huge = trace.Task(replace(tasks[0].job, id="sixteen", gpus_per_worker=16), 0.0, 10.0)
    fits, never = trace.placeable(nodes, [*tasks, pinned, huge])
    assert fits == tasks and never == [pinned, huge]
    # Kept, they would queue forever under every scheduler: the whole replay
    # would count as contended.
    nodes_csv = _write(tmp_path / "nodes.csv", NODE_HEADER, [["n0", 1, 1, 8, "G2"]])
    _write(pods, POD_HEADER, [["p0", 1, 1, 8, 1000, "", "LS", "Running", 0, 300, 0],
                              ["p1", 1, 1, 1, 1000, "T4", "LS", "Running", 0, 300, 0]])
    r = trace.compare(nodes_csv, pods, speedup=1, load=1, node_fraction=1, rack_size=4,
                      cycle_s=10, min_runtime_s=0, plot_to=None)
    assert r["tasks"] == 1 and r["skipped"]["no_node_can_hold"] == 1
    assert r["policy"]["unstarted"] == 0 and r["policy"]["contended_share"] == 0


def test_the_cli_prints_one_line_and_exits_2_on_a_bad_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = Path(trace.__file__)
    nodes = _write(tmp_path / "nodes.csv", ["sn", "gpu"], [["n0", 8]])
    done = subprocess.run([sys.executable, script, str(nodes), str(tmp_path / "p.csv"),
                           "--plot", str(tmp_path / "x.png")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("with the columns sn, gpu, model")
    assert f"{nodes}: no column model" in done.stderr and not done.stdout
    done = subprocess.run([sys.executable, script, "--load", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--load: 0 is not a number > 0" in done.stderr
