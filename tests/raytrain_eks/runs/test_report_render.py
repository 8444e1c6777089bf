"""The report renders from a run directory (local or S3) and the comparison lists every difference."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from raytrain_eks.cli import main
from raytrain_eks.runs.report import differences, load_run, render_report, throughput_summary

RUNS = Path(__file__).parents[2] / "fixtures" / "runs"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_single_run_report_has_summary_and_four_plots(tmp_path, capsys):
    assert main(["report", str(RUNS / "efa-full"), "--out", str(tmp_path)]) == 0
    assert "report.md" in capsys.readouterr().out
    text = (tmp_path / "report.md").read_text()
    for stem in ("loss", "eval", "tokens_per_s", "mfu"):
        assert f"![{stem}]({stem}.png)" in text
        assert png_size(tmp_path / f"{stem}.png") == (700, 400)
    assert "| transport | efa (efa: 1 rank(s)) |" in text
    assert "synthetic data: proves the infrastructure" in text
    assert "| eval loss before | 12 |" in text and "| eval loss after | 9.2 |" in text


def test_throughput_excludes_the_warm_up_step():
    summary = throughput_summary(load_run(str(RUNS / "efa-full")))
    assert 515 < summary["tokens_per_s"] < 545          # 1024 tokens x 0.5173 steps/s = 530
    assert summary["steps"] == 20 and summary["peak_memory_gib"] == 9.1


def test_comparison_lists_every_difference_by_group(tmp_path):
    a = json.loads((RUNS / "efa-full" / "run.json").read_text())
    b_dir = tmp_path / "b"
    shutil.copytree(RUNS / "efa-full", b_dir)
    b = json.loads(json.dumps(a))
    b["image"] = b["image"].split("@")[0] + "@sha256:" + "2" * 64
    b["image_digest"] = "sha256:" + "2" * 64
    b["code_hash"]["ran"] = "sha256:" + "d" * 64
    b["job_config"]["parallel"]["strategy"] = "hybrid_shard"
    b["cluster"]["instance_type"] = "g5.12xlarge"
    b["versions"]["nccl"] = "2.28.3"
    b["transport"]["transport"] = "socket"
    b["throughput"]["tokens_per_s"] = 1.0
    (b_dir / "run.json").write_text(json.dumps(b))
    groups = differences(a, b)
    inputs = {path for path, _, _ in groups["inputs"]}
    assert inputs == {"image", "image_digest", "code_hash.ran", "job_config.parallel.strategy", "cluster.instance_type",
                      "versions.nccl"}
    assert [p for p, _, _ in groups["runtime"]] == ["transport.transport"]
    assert [p for p, _, _ in groups["outcomes"]] == ["throughput.tokens_per_s"]
    text = render_report([str(RUNS / "efa-full"), str(b_dir)], tmp_path / "out").read_text()
    assert "### inputs (6)" in text and "| `versions.nccl` | 2.29.7 | 2.28.3 |" in text
    assert "| `job_config.parallel.strategy` | full_shard | hybrid_shard |" in text


def test_efa_vs_tcp_fixture_comparison_names_the_transport(tmp_path):
    text = render_report([str(RUNS / "efa-full"), str(RUNS / "tcp-full")], tmp_path).read_text()
    assert "| `transport.transport` | efa | socket |" in text
    assert "| `job_config.evidence.require_transport` | efa | any |" in text
    assert "### identity" in text and "| tokens/s | 527.5 | 256.2 |" in text


def test_cpu_run_without_mfu_or_record_still_renders(tmp_path):
    run = tmp_path / "cpu-run"
    run.mkdir()
    rows = [{"kind": "train", "step": s, "loss": 5.0 / s, "tokens_per_s": 100.0, "mfu": None} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    text = render_report([str(run)], tmp_path / "out").read_text()
    assert "Not drawn (no values in the metrics): eval, mfu." in text
    assert "no readable run.json" in text and "line 4 is not JSON" in text
    assert (tmp_path / "out" / "loss.png").exists() and not (tmp_path / "out" / "mfu.png").exists()


def test_report_from_s3(moto_s3, tmp_path):
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1")
    for name in ("run.json", "metrics.jsonl"):
        s3.upload_file(str(RUNS / "tcp-full" / name), "runs-111122223333", f"runs/tcp-full/{name}")
    text = render_report(["s3://runs-111122223333/runs/tcp-full"], tmp_path).read_text()
    assert "| transport | socket (socket: 1 rank(s)) |" in text


def test_missing_run_dir_is_one_line_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither run.json nor metrics.jsonl" in err


def test_report_leads_with_the_verdict_and_a_comparison_opens_with_the_factor_that_changed(tmp_path, capsys):
    from raytrain_eks.runs.report_story import marker_steps

    b_dir = tmp_path / "b"
    shutil.copytree(RUNS / "efa-full", b_dir)
    b = json.loads((b_dir / "run.json").read_text())
    b["job_config"]["train"]["lr"] = 2e-4
    b["checkpoints"] = [{"step": 10, "stall_s": 0.1, "write_s": 1.0}, {"step": 20, "stall_s": 0.1, "write_s": 1.0}]
    b["throughput"]["tokens_per_s"] = 1.0  # the metrics rows decide; the record's copy is not used
    (b_dir / "run.json").write_text(json.dumps(b))
    assert marker_steps(load_run(str(b_dir))) == {"checkpoint": [10, 20], "eval": [0, 10, 20]}

    # one run: the verdict is the first thing said, and the exit code is the verdict's
    assert main(["report", str(b_dir), "--out", str(tmp_path / "one")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "verdict: ACCEPTED: completed; no [accept] criteria declared"
    lines = (tmp_path / "one" / "report.md").read_text().splitlines()
    assert lines[2] == "**Verdict: ACCEPTED: completed; no [accept] criteria declared**"

    # A's record states no lr (the job's default applied): the factor is still named
    text = render_report([str(RUNS / "efa-full"), str(b_dir)], tmp_path / "two").read_text()
    assert text.startswith("# Run report: A (train.lr=None) vs B (train.lr=0.0002)\n")
    paragraph = text.split("## What changed\n\n", 1)[1].split("\n", 1)[0]
    assert paragraph.startswith("B differs from A in one factor, `train.lr`: None -> 0.0002.")
    assert "Steady-state throughput is unchanged" in paragraph and "Verdicts: A accepted, B accepted." in paragraph


def test_any_number_of_runs_one_row_each_with_the_factors_that_differ(tmp_path, capsys):
    """Three runs of one sweep: one row per run, the varied factors as columns, the outcome beside."""
    dirs = []
    for i, (lr, seed) in enumerate(((3e-4, 1), (1e-4, 1), (1e-4, 2))):
        run = tmp_path / f"sweep-{i}"
        shutil.copytree(RUNS / "efa-full", run)
        record = json.loads((run / "run.json").read_text())
        record["job_config"]["train"].update(lr=lr, seed=seed)
        (run / "run.json").write_text(json.dumps(record))
        dirs.append(str(run))
    assert main(["report", *dirs, "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    table = text.split("## What changed\n\n", 1)[1].split("\n\n", 2)[1].splitlines()
    assert table[0] == "| run | `train.lr` | `train.seed` | verdict | tokens/s | held-out loss after |"
    assert [row.split(" | ")[1:3] for row in table[2:]] == [["0.0003", "1"], ["0.0001", "1"], ["0.0001", "2"]]
    assert table[2].startswith("| A efa-full |") and table[4].startswith("| C efa-full |")  # the record names the run
    assert "| | A | B | C |" in text and "**Verdict C: ACCEPTED" in text


def test_a_run_that_measured_the_network_first_shows_it_beside_tokens_per_s_and_mfu(tmp_path):
    """run.json's ``netcheck`` (netcheck.run_first: the smoke job) is a summary row after MFU."""
    run = tmp_path / "run"
    shutil.copytree(RUNS / "efa-full", run)
    record = json.loads((run / "run.json").read_text())
    record["netcheck"] = {"verdict": "accepted", "uri": "s3://b/runs/x/netcheck.json",
                          "figures": {"transport": "efa", "inter_busbw_gbs": 10.0, "intra_busbw_gbs": 20.0,
                                      "link_gbs": 12.5, "link_ratio": 0.8, "efa_over_socket": 5.0}}
    (run / "run.json").write_text(json.dumps(record))
    text = render_report([str(run)], tmp_path / "out").read_text()
    row = ("| network (netcheck) | ACCEPTED, transport efa, inter-node all-reduce busbw 10.00 GB/s, intra-node "
           "20.00 GB/s, 80% of the link, 5.0x sockets |")
    assert row in text and text.index("| MFU |") < text.index(row)


def test_the_exposed_communication_row_says_how_it_is_known(tmp_path):
    """run.json's ``exposed_comm`` beside tokens/s and MFU, its label first: the step model's
    prediction as ``predicted``; a run with none says ``unknown`` (never a figure); a record from
    before the field shows n/a."""
    run = tmp_path / "run"
    shutil.copytree(RUNS / "efa-full", run)
    record = json.loads((run / "run.json").read_text())
    rows = {}
    for name, value in (("predicted", {"label": "predicted", "share": [0.121, 0.2404], "seconds": [0.31, 0.88],
                                       "source": "raytrain_eks/planning/step_model.py, ..."}),
                        ("unknown", {"label": "unknown", "why": "the job does not time its collectives ..."}),
                        ("absent", None)):
        record["exposed_comm"] = value
        (run / "run.json").write_text(json.dumps(record))
        text = render_report([str(run)], tmp_path / name).read_text()
        rows[name] = next(line for line in text.splitlines() if line.startswith("| exposed communication |"))
        assert text.index("| MFU |") < text.index(rows[name])
    assert rows["predicted"] == ("| exposed communication | predicted 12.1-24.0% of the step (0.31-0.88 s; "
                                 "raytrain_eks/planning/step_model.py) |")
    assert rows["unknown"] == ("| exposed communication | unknown: the job does not time its collectives and had no "
                               "step-model prediction (run.json: exposed_comm) |")
    assert rows["absent"] == "| exposed communication | n/a |"


def test_the_predicted_step_sits_beside_the_measured_one_with_what_it_assumed(tmp_path):
    """The step model's range the run was handed (run.json ``exposed_comm``: step time, MFU and
    the figures it assumed, raytrain_eks/planning/step_model.py ``exposed_comm``) under the measured step
    time; a run without a prediction shows n/a, never a figure."""
    run = tmp_path / "run"
    shutil.copytree(RUNS / "efa-full", run)
    record = json.loads((run / "run.json").read_text())
    record["exposed_comm"] = {"label": "predicted", "share": [0.12, 0.24], "seconds": [0.3, 0.9],
                              "step_s": [5.69, 8.04], "mfu": [0.1737, 0.2454], "assumed": ["gemm", "pcie"],
                              "calibrated": False}
    (run / "run.json").write_text(json.dumps(record))
    text = render_report([str(run)], tmp_path / "out").read_text()
    row = ("| step time, predicted | predicted 8.04-5.69 s (slow-fast), MFU 17.4-24.5% (raytrain_eks/planning/step_model.py; "
           "assumed: gemm, pcie) |")
    assert row in text and text.index("| step time (s) |") < text.index(row)
    record["exposed_comm"] = {"label": "unknown", "why": "..."}
    (run / "run.json").write_text(json.dumps(record))
    assert "| step time, predicted | n/a |" in render_report([str(run)], tmp_path / "out2").read_text()


def test_the_prediction_handed_to_a_run_carries_its_ranges_and_assumptions():
    from raytrain_eks.planning.step_model import exposed_comm

    prediction = {"step_s": (5.0, 8.0), "mfu": (0.17, 0.25), "assumed": ["gemm"], "measured_step": None,
                  "terms": {"forward_gathers_s": (0.1, 0.2), "backward_reduce_scatters_s": (0.2, 0.4),
                            "step_all_reduce_s": (0.0, 0.1)}}
    handed = exposed_comm(prediction)
    assert handed["step_s"] == [5.0, 8.0] and handed["mfu"] == [0.17, 0.25]
    assert handed["assumed"] == ["gemm"] and handed["calibrated"] is False


def test_two_runs_show_their_cost_and_cost_per_1m_tokens_side_by_side(tmp_path, capsys):
    from training import incidents

    # an on-demand run and a spot run (its price an estimate) that lived through a reclaim
    a_dir, b_dir = tmp_path / "on-demand", tmp_path / "spot"
    for where, capacity, price, usd, incidents in (
            (a_dir, "on-demand", 4.6, 9.2, []),
            (b_dir, "spot", 1.84, 4.6, [{**incidents.incident(incidents.PREEMPTION, ranks=[4, 5, 6, 7], nodes=["n2"],
                                                              step=8), "resumed_from_step": 8, "steps_lost": 0,
                                         "gpu_minutes_lost": 4.0}])):
        shutil.copytree(RUNS / "efa-full", where)
        record = json.loads((where / "run.json").read_text())
        record["incidents"] = incidents
        record["cost"] = {"node_hours": [{"instance_type": "g6.12xlarge", "capacity_type": capacity,
                                          "node_hours": usd / price, "usd_per_node_hour": price, "usd": usd,
                                          "price": "on-demand price" if capacity == "on-demand" else "spot estimate"}],
                          "usd": usd, "tokens": 4_000_000, "usd_per_1m_tokens": usd / 4, "estimate": capacity == "spot",
                          "gpu_minutes_lost": 4.0 if incidents else 0.0, "price_label": "x"}
        (where / "run.json").write_text(json.dumps(record))
    text = render_report([str(a_dir), str(b_dir)], tmp_path / "out").read_text()
    assert "| cost | $9.20 | ~$4.60 est. |" in text
    assert "| cost per 1M tokens | $2.30 | ~$1.15 est. |" in text
    assert "| incidents | none | 1 incident (1 preemption) |" in text
    # runs: the cost column
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].rstrip().endswith("cost") and "~$4.60 est." in out and "$9.20" in out
