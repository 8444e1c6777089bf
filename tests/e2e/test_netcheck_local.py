"""`raytrain-eks netcheck --local`: the netcheck job through the same path as a training run
(charts' RayJob, `ray job submit` to a real local Ray head, moto's S3 for storage, the record
copied back), with gloo on two CPU workers: the figures, the record, the verdict, the plot. It
runs on the session's warm head (``warm_head`` in tests/conftest.py), a Ray job of its own."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from left_running import left_running, on_the_warm_head
from shared_run import ROOT
from training.netcheck.worker import COLLECTIVES, busbw_gbs, sizes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def netcheck(tmp_path_factory, warm_head):
    out = tmp_path_factory.mktemp("netcheck")
    proc = subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "netcheck", "--local", "--out", str(out),
                           "--set", "netcheck.max_bytes=2097152",
                           # the figures' count and form are tested, not their precision
                           "--set", "netcheck.iters=2", "--set", "netcheck.warmup_iters=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200, env=warm_head)
    return out, proc


def test_the_record_holds_both_modes_by_scope_collective_and_size(netcheck):
    out, proc = netcheck
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    record = json.loads((out / "netcheck.json").read_text())
    assert set(record["modes"]) == {"nccl", "socket"}
    for result in record["modes"].values():
        got = {(r["scope"], r["collective"], r["bytes"]) for r in result["rows"]}
        # one node of two workers: the intra scope only (inter groups have one rank each)
        assert got == {("intra", c, s) for c in COLLECTIVES for s in sizes(1 << 20, 1 << 21)}
        for row in result["rows"]:
            assert row["ranks"] == 2 and row["seconds"] > 0
            assert row["busbw_gbs"] == pytest.approx(busbw_gbs(row["collective"], row["bytes"], row["seconds"], 2))
        # the transport evidence of every rank: gloo on one node
        ranks = result["evidence"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert {(r["transport"], r["network"]) for r in ranks} == {("single-node", "gloo")}


def test_the_verdict_skips_what_one_node_cannot_judge_and_the_cli_says_it(netcheck):
    out, proc = netcheck
    verdict = json.loads((out / "netcheck.json").read_text())["verdict"]
    assert verdict["verdict"] == "accepted"
    assert {c["name"]: c["ok"] for c in verdict["checks"]} == {"link": None, "efa_faster": None}
    assert "scope  collective" in proc.stdout and "transport: nccl: single-node, socket: single-node" in proc.stdout
    assert "    verdict:   ACCEPTED" in proc.stdout


def test_the_plot_lies_beside_the_record(netcheck):
    out, _ = netcheck
    assert (out / "netcheck.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_netcheck_prints_no_preemption_watcher_error(netcheck):
    """Its trainers run without Ray Train's PreemptionWatcher, as the training's do (training/metrics.py)."""
    _, proc = netcheck
    assert "PreemptionWatcher" not in proc.stdout + proc.stderr


def test_the_warm_head_ran_it_and_runs_on(netcheck):
    out, proc = netcheck
    assert on_the_warm_head(out) == "SUCCEEDED"
    assert "(warm: " in proc.stdout  # and the submit said whose head it was


def test_a_bad_netcheck_field_is_one_line_before_anything_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "netcheck", "--local", "--out", str(tmp_path / "o"),
                           "--set", "netcheck.max_bytes=3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: jobs/netcheck.toml: netcheck.max_bytes: 3 must be between min_bytes "
                                   "(1048576) and 4294967296")
    assert not (tmp_path / "o").exists()


@pytest.mark.xdist_group("local_run")
def test_a_training_run_measures_the_network_first_and_its_record_says_so(local_run):
    """The session's shared run (tests/shared_run.py: ``NETCHECK_FIRST_SETS``) measured the network first."""
    out, proc = local_run
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    record = json.loads((out / "run.json").read_text())
    assert record["verdict"]["verdict"] == "accepted"
    assert record["netcheck"]["verdict"] == "accepted"
    assert record["netcheck"]["uri"].endswith(f"/{record['job_config']['checkpoint']['run_name']}/netcheck.json")
    measured = json.loads((out / "netcheck.json").read_text())  # copied with the run
    assert measured["verdict"]["figures"] == record["netcheck"]["figures"]
    assert "netcheck: ACCEPTED" in proc.stdout
    assert left_running(out) == {}
