"""The netcheck's figures and verdict: nccl-tests' bus bandwidth definition (oracle), the scope
grouping, the verdict's rules."""
from __future__ import annotations

import pytest

from pathlib import Path

from training.netcheck.worker import BUS_FACTOR, busbw_gbs, link_gbs, sizes
from training.netcheck import mode_env
from training.netcheck import NCCL_MODE, SOCKET_MODE, judge
from training.netcheck.worker import scope_groups
from training.transport import aggregate, classify_file

NCCL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_bus_factors_are_nccl_tests_definition(n):
    """Oracle: NVIDIA/nccl-tests v2.19.6 (the DLC's all_reduce_perf), doc/PERFORMANCE.md,
    "### Summary": AllReduce 2*(n-1)/n, ReduceScatter (n-1)/n, AllGather (n-1)/n; ``algbw = S/t``
    with S the total array for ReduceScatter and AllGather (``recvcount*sizeof(datatype)*n``)."""
    assert BUS_FACTOR["all_reduce"](n) == pytest.approx(2 * (n - 1) / n)
    assert BUS_FACTOR["reduce_scatter"](n) == pytest.approx((n - 1) / n)
    assert BUS_FACTOR["all_gather"](n) == pytest.approx((n - 1) / n)
    # 1 GB all-reduced in 1 s by 8 ranks: algbw 1 GB/s, busbw 1.75 GB/s (nccl-tests' GB = 1e9 B)
    assert busbw_gbs("all_reduce", 10**9, 1.0, 8) == pytest.approx(1.75)


def test_sizes_double_from_min_to_max_as_nccl_tests_b_e_f2():
    assert sizes(1 << 20, 1 << 23) == [1 << 20, 1 << 21, 1 << 22, 1 << 23]
    assert sizes(1000, 3000) == [1000, 2000]
    assert link_gbs(100) == 12.5


def test_scopes_group_ranks_by_node_and_by_local_rank():
    places = [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert scope_groups(places) == {"intra": [[0, 1], [2, 3]], "inter": [[0, 2], [1, 3]], "world": [[0, 1, 2, 3]]}
    # one node: no world scope (it is intra); inter groups of one rank each (skipped when measured)
    assert scope_groups([(0, 0), (0, 1)]) == {"intra": [[0, 1]], "inter": [[0], [1]]}


def _rows(scope, busbw):
    return [{"scope": scope, "collective": "all_reduce", "bytes": 1 << 20, "busbw_gbs": busbw / 2},
            {"scope": scope, "collective": "all_reduce", "bytes": 1 << 21, "busbw_gbs": busbw}]


LOG_OF = {"efa": "efa_rank0.log", "socket": "socket_fallback_rank4.log"}
"""A real NCCL log per class (tests/fixtures/nccl)."""


def _evidence(*logs: str) -> dict:
    """Every rank's evidence as the worker gathers it: its NCCL log classified, then aggregated."""
    ranks = [classify_file(str(NCCL_LOGS / log)) for log in logs]
    for rank, found in enumerate(ranks):
        found.rank = rank
    return aggregate(ranks)


# A forced run as NCCL 2.29.7 logs it with NCCL_NET=Socket and NCCL_NET_PLUGIN=none: no NET/OFI line at all
# (the plugin is never opened), "Using network Socket" (src/init.cc:457), channels via NET/Socket
# (src/transport/net.cc:363).
FORCED_SOCKET = {"transport": "socket", "ranks": [
    {"rank": rank, "transport": "socket", "network": "Socket", "provider": "", "ofi_nccl_version": "",
     "evidence": ["h:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"]} for rank in (0, 1)]}


def _modes(efa_busbw, socket_busbw, *, transport="efa", socket_transport="socket"):
    socket_evidence = FORCED_SOCKET if socket_transport == "socket" else _evidence(LOG_OF[socket_transport])
    return {"nccl": {"rows": _rows("intra", 50.0) + _rows("inter", efa_busbw), "evidence": {"transport": transport}},
            "socket": {"rows": _rows("inter", socket_busbw), "evidence": socket_evidence}}


def _failed(judged):
    return sorted(c["name"] for c in judged["checks"] if c["ok"] is False)


def test_efa_at_link_speed_and_faster_than_sockets_is_accepted():
    judged = judge(_modes(10.0, 2.0), link_gbps=100, min_link_fraction=0.5, require_transport="efa")
    assert judged["verdict"] == "accepted" and judged["exit_code"] == 0
    assert judged["figures"]["link_ratio"] == pytest.approx(10.0 / 12.5)
    assert judged["figures"]["efa_over_socket"] == pytest.approx(5.0)


def test_inter_node_busbw_below_the_declared_link_fraction_is_rejected():
    judged = judge(_modes(5.0, 2.0), link_gbps=100, min_link_fraction=0.5, require_transport="efa")
    assert judged["verdict"] == "rejected" and judged["exit_code"] == 3
    assert _failed(judged) == ["link"]


def test_efa_not_faster_than_sockets_is_rejected():
    judged = judge(_modes(10.0, 10.0), link_gbps=100, min_link_fraction=0.5, require_transport="efa")
    assert _failed(judged) == ["efa_faster"]


def test_nccl_run_not_on_efa_is_rejected_when_required_and_the_forced_run_must_be_sockets():
    assert _failed(judge(_modes(10.0, 2.0, transport="socket"), link_gbps=100, min_link_fraction=0.5,
                         require_transport="efa")) == ["transport"]
    assert _failed(judge(_modes(10.0, 2.0, socket_transport="efa"), link_gbps=100, min_link_fraction=0.5,
                         require_transport="efa")) == ["socket_run"]


def _forced_run_check(socket_evidence: dict) -> dict:
    modes = _modes(10.0, 2.0)
    modes[SOCKET_MODE]["evidence"] = socket_evidence
    judged = judge(modes, link_gbps=100, min_link_fraction=0.5, require_transport="efa")
    return next(c for c in judged["checks"] if c["name"] == "socket_run")


def test_the_forced_run_fails_when_any_rank_shows_efa_or_the_ofi_plugin():
    """The run forced to sockets proves NCCL's own Socket transport on EVERY rank: the run's
    aggregate class is the worst rank's (socket beats efa), so one rank on sockets made a run
    whose other ranks used EFA pass; and aws-ofi-nccl on libfabric's tcp provider (channels via
    NET/Libfabric) is classified socket though it is not NCCL's socket transport, and its being
    loaded at all means NCCL_NET_PLUGIN=none did not take."""
    assert _forced_run_check(FORCED_SOCKET)["ok"] is True
    mixed = _evidence("socket_fallback_rank4.log", "efa_rank0.log")
    assert mixed["transport"] == "socket"  # the aggregate alone would pass it
    check = _forced_run_check({**mixed, "ranks": [FORCED_SOCKET["ranks"][0], mixed["ranks"][1]]})
    assert check["ok"] is False and "rank 1" in check["detail"] and "efa" in check["detail"]
    ofi_tcp = _evidence("ofi_tcp_provider.log")
    assert ofi_tcp["transport"] == "socket"
    check = _forced_run_check(ofi_tcp)
    assert check["ok"] is False and "aws-ofi-nccl" in check["detail"] and "NCCL_NET_PLUGIN=none" in check["detail"]
    check = _forced_run_check(_evidence("socket_fallback_rank4.log"))  # the plugin was opened, failed, NCCL fell back
    assert check["ok"] is False and "aws-ofi-nccl" in check["detail"]
    check = _forced_run_check({"transport": "socket", "ranks": []})
    assert check["ok"] is False and "no rank" in check["detail"]


# NVIDIA/nccl v2.29.7-1, how a communicator gets its network, ported as the oracle of the forced
# run's environment (training/netcheck/__init__.py SOCKET_ENV): src/plugin/net.cc:245-276
# (initPluginLibsOnceFunc) NCCL_NET_PLUGIN lists the external plugins to open ("none": none; unset:
# libnccl-net.so), :279-284 then the internal IB and Socket nets; :305-307 (ncclNetInit) only a net
# whose name equals comm->config.netName (strcasecmp) is initialised, and the first that
# initialises is the communicator's; src/init.cc:1857-1866 netName is NCCL_NET;
# src/transport/net_socket.cc:725 the internal net's name "Socket". src/misc/param.cc:51 with
# src/os/linux.cc:57-58: /etc/nccl.conf is applied with setenv(..., 0), so the environment wins.
def nccl_assigned_net(env: dict[str, str], *, external: dict[str, str], ib_devices: bool = False) -> str:
    """The net NCCL gives a communicator. ``external``: a library as NCCL_NET_PLUGIN names it ->
    its net's name."""
    wanted = env.get("NCCL_NET_PLUGIN")
    libs = ["libnccl-net.so"] if wanted is None else [n for n in ("" if wanted.lower() == "none" else wanted).split(",") if n]
    nets = [external[lib] for lib in libs if lib in external]  # a library that does not open is skipped
    nets += (["IB"] if ib_devices else []) + ["Socket"]  # IB's init fails without IB devices (EKS: EFA only)
    name = env.get("NCCL_NET")
    return next(net for net in nets if name is None or net.lower() == name.lower())


def test_the_forced_run_s_environment_gives_nccl_s_socket_transport_though_the_ofi_plugin_is_installed():
    """The pods' env (charts/cluster_spec.py ``gpu_worker_env``: NCCL_NET_PLUGIN=ofi, which NCCL
    opens as libnccl-net-ofi.so, src/plugin/plugin_open.cc ``openPluginLib``) with the forced
    run's on top (Ray 2.58 ``_private/utils.py`` ``update_envs``: a runtime env's env_vars
    replace the process's): NCCL's Socket net, whether or not the DLC also links the plugin as
    libnccl-net.so; the NCCL run keeps the plugin. Each of NCCL_NET=Socket and
    NCCL_NET_PLUGIN=none alone would do; both make it exact (no plugin opened: no NET/OFI line)."""
    from charts.cluster_spec import gpu_worker_env
    from environment import load_environment

    group = load_environment("environment.toml").primary_gpu_group
    assert group.efa_per_node
    pod = {pair["name"]: pair["value"] for pair in gpu_worker_env(group)}
    plugins = {"ofi": "Libfabric", "libnccl-net.so": "Libfabric"}  # aws-ofi-nccl's net
    assert nccl_assigned_net(pod, external=plugins) == "Libfabric"
    assert nccl_assigned_net({**pod, **mode_env(NCCL_MODE)}, external=plugins) == "Libfabric"
    assert nccl_assigned_net({**pod, **mode_env(SOCKET_MODE)}, external=plugins) == "Socket"
    assert nccl_assigned_net({**pod, **mode_env(SOCKET_MODE)}, external=plugins, ib_devices=True) == "Socket"
    assert mode_env(SOCKET_MODE)["NCCL_NET_PLUGIN"] == "none"  # no plugin opened: any NET/OFI line is a failure


def test_one_node_or_unknown_link_skips_the_rules_it_cannot_judge():
    one_node = {"nccl": {"rows": _rows("intra", 1.0), "evidence": {"transport": "single-node"}},
                "socket": {"rows": _rows("intra", 1.0), "evidence": {"transport": "single-node"}}}
    judged = judge(one_node, link_gbps=0, min_link_fraction=0.5, require_transport="any")
    assert judged["verdict"] == "accepted"
    assert {c["name"]: c["ok"] for c in judged["checks"]} == {"link": None, "efa_faster": None}
    judged = judge(_modes(1.0, 2.0), link_gbps=0, min_link_fraction=0.5, require_transport="any")
    assert _failed(judged) == ["efa_faster"]  # no link figure: only the comparison judges


def test_a_rejected_netcheck_before_training_fails_the_run_at_stage_transport(tmp_path, monkeypatch):
    """``netcheck.run_first``: the rejection :func:`before_training` raises is what the driver's
    record turns into an execution failure of stage ``transport`` (exit 1: the Smoke stage fails)."""
    from training import netcheck
    from training.config import load_job_config
    from training.launch import finish_record, start_record
    from training.transport import TransportError

    job = load_job_config("jobs/local.toml", [f"checkpoint.storage_path={tmp_path}", "netcheck.run_first=true"])
    modes = _modes(10.0, 10.0)
    rejected = {"modes": modes, "uri": str(tmp_path / "netcheck.json"),
                "verdict": judge(modes, link_gbps=100, min_link_fraction=0.5, require_transport="efa")}
    # measure() fits on Ray (tests/e2e/test_netcheck_local.py runs it): here its record is given
    monkeypatch.setattr(netcheck, "measure", lambda job: rejected)
    record = start_record(job, ["python", "-m", "training"])
    with pytest.raises(TransportError) as raised:
        netcheck.before_training(job)
    final = finish_record(record, returned=None, error=raised.value)
    assert final["verdict"]["verdict"] == "execution-failed" and final["verdict"]["stage"] == "transport"
    assert final["exit_code"] == 1 and "netcheck REJECTED: EFA" in final["error"]


@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("size", [1000, 1 << 20, 3 * (1 << 20) + 4])
def test_the_buffers_are_the_sizes_nccl_tests_moves(n, size):
    """Oracle: NVIDIA/nccl-tests v2.19.6 src/all_reduce.cu ``AllReduceGetCollByteCount``
    (sendcount = count) and ``AllReduceGetBw`` (``count * typesize``); src/all_gather.cu and
    src/reduce_scatter.cu ``*GetCollByteCount`` (``base = (count/nranks) & ~(16/eltSize - 1)``)
    and ``*GetBw`` (``count * typesize * nranks`` with count = base); common.cu: count = size /
    wordSize. The busbw is of what moved, not of the size asked for."""
    from training.netcheck.worker import moved_bytes

    count = size // 4
    assert moved_bytes("all_reduce", size, n) == count * 4
    base = (count // n) & ~(16 // 4 - 1)
    for collective in ("all_gather", "reduce_scatter"):
        assert moved_bytes(collective, size, n) == base * n * 4
        assert moved_bytes(collective, size, n) % (16 * n) == 0


def _mean_worker(rank, out_dir):
    import json
    import os

    import torch
    import torch.distributed as dist

    from training.netcheck.worker import ranks_mean

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{os.path.join(out_dir, 'pg')}")
    mean = ranks_mean([1.0, 3.0][rank], None, 2, torch.device("cpu"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as out:
        json.dump({"mean": mean}, out)
    dist.destroy_process_group()


@pytest.mark.subprocess
def test_a_size_s_time_is_the_ranks_average_as_all_reduce_perf_reports_it():
    """Oracle: NVIDIA/nccl-tests v2.19.6 src/common.cu: ``static int average = 1`` (``-a``: 0 rank
    0, 1 AVG, 2 MIN, 3 MAX) and ``Allreduce(args, &deltaSec, average)``, which for 1 sums the
    ranks' times (MPI_SUM) and divides by their number. Two gloo ranks timing 1 s and 3 s: 2 s
    on both (the slowest rank's, 3 s, is ``-a 3``)."""
    from spawn_ranks import spawn_ranks

    assert [r["mean"] for r in spawn_ranks(_mean_worker)] == [2.0, 2.0]


def test_the_link_is_judged_by_what_one_node_s_link_carries():
    """The inter scope times one group per local rank at once (4 on a g6.12xlarge), all through
    the node's one link: 4 groups at 1.0 GB/s busbw each are 4.0 GB/s through a 40 Gbit/s (5 GB/s)
    link, 80 %, not 20 %."""
    rows = [{"scope": "inter", "collective": "all_reduce", "bytes": 1 << 20, "busbw_gbs": 1.0, "groups": 4, "ranks": 2}]
    modes = {"nccl": {"rows": rows, "evidence": {"transport": "efa"}},
             "socket": {"rows": [{**rows[0], "busbw_gbs": 0.25}], "evidence": FORCED_SOCKET}}
    judged = judge(modes, link_gbps=40, min_link_fraction=0.5, require_transport="efa")
    assert judged["verdict"] == "accepted", judged["checks"]
    assert judged["figures"]["inter_node_busbw_gbs"] == pytest.approx(4.0)
    assert judged["figures"]["link_ratio"] == pytest.approx(0.8)
    assert judged["figures"]["inter_busbw_gbs"] == pytest.approx(1.0)  # one communicator's, as nccl-tests prints it
