"""The NCCL transport classifier on real-format log lines, and the require_transport gate."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from training import transport
from training.transport import RankTransport, TransportError, TransportGate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nccl"


def classify(name: str) -> RankTransport:
    return transport.classify_file(str(FIXTURES / name))


def test_efa_rank_is_efa_despite_the_socket_init_line():
    rank = classify("efa_rank0.log")
    assert rank.transport == "efa"
    assert rank.rank == 0 and rank.num_nodes == 2 and rank.host == "ip-10-0-1-23"
    assert rank.provider == "efa" and rank.network == "Libfabric"
    assert rank.ofi_nccl_version == "1.20.0" and rank.nccl_version == "2.29.7+cuda13.0"
    assert "via NET/Libfabric/0" in rank.evidence[0]


def test_socket_fallback_is_socket():
    rank = classify("socket_fallback_rank4.log")
    assert rank.transport == "socket"
    assert rank.rank == 4
    assert "via NET/Socket/0" in rank.evidence[0]


def test_libfabric_over_the_tcp_provider_is_socket():
    rank = classify("ofi_tcp_provider.log")
    assert rank.transport == "socket"
    assert "'tcp' provider" in rank.reason


def test_single_node_is_single_node_even_with_efa_loaded():
    rank = classify("single_node_rank1.log")
    assert rank.transport == "single-node"
    assert rank.num_nodes == 1


def test_no_info_lines_is_unknown_and_missing_file_is_unknown(tmp_path):
    assert classify("unknown_warn_only.log").transport == "unknown"
    missing = transport.classify_file(str(tmp_path / "nope.log"))
    assert missing.transport == "unknown" and "not found" in missing.reason


def test_announced_network_decides_before_any_channel_is_connected():
    rank = classify("efa_cloudwatch_prefixed.log")   # timestamps in front, "Selected Provider" capitalised
    assert rank.transport == "efa" and rank.rank == 5
    announced_socket = ["h:1:1 [0] NCCL INFO Using network Socket",
                        "h:1:1 [0] NCCL INFO comm 0x1 rank 3 nRanks 8 nNodes 2 localRanks 4 localRank 3 MNNVL 0"]
    assert transport.classify_lines(announced_socket).transport == "socket"


def test_aggregate_takes_the_worst_rank():
    ranks = [classify("efa_rank0.log"), classify("socket_fallback_rank4.log")]
    evidence = transport.aggregate(ranks)
    assert evidence["transport"] == "socket" and not evidence["consistent"]
    assert evidence["counts"] == {"efa": 1, "socket": 1}
    assert [r["rank"] for r in evidence["ranks"]] == [0, 4]
    all_efa = transport.aggregate([classify("efa_rank0.log"), classify("efa_cloudwatch_prefixed.log")])
    assert all_efa["transport"] == "efa" and all_efa["consistent"]


def test_gate_stops_a_run_that_requires_efa_and_sees_sockets():
    evidence = transport.aggregate([classify("efa_rank0.log"), classify("socket_fallback_rank4.log")])
    with pytest.raises(TransportError) as caught:
        TransportGate(require="efa").check(evidence)
    message = str(caught.value)
    assert "\n" not in message
    assert "require_transport = 'efa'" in message and "1 of 2 ranks saw 'socket'" in message
    assert "rank 4 on ip-10-0-1-57" in message and "NET/Socket" in message


def test_gate_passes_efa_and_any():
    efa = transport.aggregate([classify("efa_rank0.log")])
    TransportGate(require="efa").check(efa)
    TransportGate(require="any").check(transport.aggregate([classify("socket_fallback_rank4.log")]))


def test_gate_refuses_unknown_when_efa_required():
    unknown = transport.aggregate([classify("unknown_warn_only.log")])
    with pytest.raises(TransportError, match="NCCL_DEBUG=INFO"):
        TransportGate(require="efa").check(unknown)
    with pytest.raises(TransportError, match="no rank reported"):
        TransportGate(require="efa").check(transport.aggregate([]))
    with pytest.raises(ValueError, match="require_transport"):
        TransportGate(require="infiniband")


def test_round_trip_through_a_dict_as_all_gather_object_does():
    rank = classify("efa_rank0.log")
    assert RankTransport.from_dict(rank.to_dict()) == rank


def test_debug_env_and_own_log_file(tmp_path):
    env = transport.nccl_debug_env(str(tmp_path), environ={"NCCL_DEBUG": "WARN"})
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl.%h.%p.log")
    # What NCCL writes for this process once %h and %p are expanded:
    mine = tmp_path / f"nccl.ip-10-0-1-23.{os.getpid()}.log"
    mine.write_text((FIXTURES / "efa_rank0.log").read_text())
    (tmp_path / "nccl.ip-10-0-1-23.1.log").write_text("other process")
    assert transport.own_nccl_log(str(tmp_path)) == str(mine)
    assert transport.classify_file(transport.own_nccl_log(str(tmp_path))).transport == "efa"


def test_gloo_evidence():
    assert transport.non_nccl_evidence("gloo", 1).transport == "single-node"
    assert transport.non_nccl_evidence("gloo", 2).transport == "socket"


def test_collect_evidence_on_a_gloo_process_group(tmp_path):
    """The one call the loop makes, on a real (1-process, gloo) process group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        evidence = transport.collect_evidence(require="single-node", log_dir=None, num_nodes=1)
        assert evidence["transport"] == "single-node" and evidence["ranks"][0]["network"] == "gloo"
        assert list(transport.hosts_from_evidence(evidence)) == ["0"]
        with pytest.raises(TransportError, match="require_transport = 'efa'.*'single-node'"):
            transport.collect_evidence(require="efa", log_dir=None, num_nodes=1)
    finally:
        dist.destroy_process_group()


def _nccl_writes_its_log(environ: dict, lines: str, host: str = "ip-10-0-1-23"):
    """What NCCL's first collective does with the debug file (src/debug.cc): expand %h and %p in
    NCCL_DEBUG_FILE and open it; when that fails it quietly logs to stdout instead."""
    def connect() -> None:
        target = environ["NCCL_DEBUG_FILE"].replace("%h", host).replace("%p", str(os.getpid()))
        try:
            with open(target, "w") as handle:
                handle.write(lines)
        except OSError:
            print(lines)
    return connect


def _one_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    return dist


def test_evidence_comes_out_when_the_log_folder_does_not_exist_beforehand(tmp_path, capsys):
    # Given a node where the NCCL log folder does not exist yet (a fresh pod),
    log_dir = str(tmp_path / "fresh-node" / "raytrain-nccl")
    environ: dict[str, str] = {}
    dist = _one_process_group(tmp_path)
    try:
        # when the worker prepares NCCL's logging (the loop's GPU set-up) and NCCL's first
        # collective writes its INFO lines (the only injected, device-specific call),
        transport.prepare_nccl_logging(log_dir, environ)
        efa_lines = (FIXTURES / "efa_rank0.log").read_text()
        evidence = transport.collect_evidence(require="efa", log_dir=log_dir, num_nodes=2, backend="nccl",
                                              connect=_nccl_writes_its_log(environ, efa_lines))
    finally:
        dist.destroy_process_group()
    # then the rank's file exists, is classified, and the efa gate passes.
    assert os.path.isdir(log_dir) and transport.own_nccl_log(log_dir)
    assert evidence["transport"] == "efa" and evidence["ranks"][0]["provider"] == "efa"
    assert "NET/Libfabric" not in capsys.readouterr().out  # nothing fell back to stdout


def test_a_missing_log_names_the_cause_not_nccl_debug_when_it_is_set(tmp_path):
    # Given NCCL_DEBUG=INFO but a folder NCCL could not write into (it logged to stdout),
    log_dir = str(tmp_path / "never-created")
    environ = transport.nccl_debug_env(log_dir, environ={})
    dist = _one_process_group(tmp_path)
    try:
        os.environ.update(environ)
        evidence = transport.collect_evidence(require="any", log_dir=log_dir, num_nodes=2, backend="nccl",
                                              connect=_nccl_writes_its_log(environ, "x NCCL INFO Using network AWS Libfabric"))
    finally:
        for key in environ:
            os.environ.pop(key, None)
        dist.destroy_process_group()
    problem = TransportGate(require="efa").problem(evidence)
    # then the refusal is one line that names the folder, and does not ask for NCCL_DEBUG=INFO.
    assert problem and "\n" not in problem
    assert "does not exist" in problem and log_dir in problem
    assert "set NCCL_DEBUG=INFO" not in problem
