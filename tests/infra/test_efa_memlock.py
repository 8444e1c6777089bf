"""The EFA nodes' memlock limit, as nodeadm and containerd will read the launch template's
NodeConfig.

Oracle: port of ``awslabs/amazon-eks-ami`` (commit 81fec2e8), ``nodeadm/internal/containerd/
base_runtime_spec.go`` ``writeBaseRuntimeSpec``: the NodeConfig's ``baseRuntimeSpec`` is merged
into ``base-runtime-spec.json`` by ``nodeadm/internal/util/merge.go`` ``Merge`` (both sides
through encoding/json into ``map[string]interface{}``, then ``mergo.Merge`` with
``WithOverride``: maps merge key by key, a list replaces the default's) and written back with
``json.MarshalIndent``, so every number passes through a float64 and is written as its shortest
decimal. containerd then decodes the file into the OCI spec, whose rlimits are uint64.
"""
from __future__ import annotations

from decimal import Decimal

import pytest
import yaml

from environment.contract import EFA_MEMLOCK_BYTES, EFA_MEMLOCK_RLIMIT
from infra.constructs.node_groups import NODEADM_DEFAULT_RLIMITS, node_config_user_data

UINT64_MAX = 2**64 - 1
DEFAULT_SPEC = {"ociVersion": "1.1.0", "process": {"rlimits": NODEADM_DEFAULT_RLIMITS,
                                                   "noNewPrivileges": True}}
"""The part of nodeadm's base-runtime-spec.json the merge touches (its process.rlimits)."""


def _go_json_number(value):
    """A JSON number after encoding/json's float64 (shortest decimal that reads back the same)."""
    return int(Decimal(repr(float(value)))) if isinstance(value, int) and not isinstance(value, bool) else value


def _through_go_json(doc):
    if isinstance(doc, dict):
        return {k: _through_go_json(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_through_go_json(v) for v in doc]
    return _go_json_number(doc)


def _mergo_override(dst: dict, src: dict) -> dict:
    out = dict(dst)
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _mergo_override(out[key], value)
        elif value not in (None, [], {}, "", 0, False):
            out[key] = value  # lists included: replaced, not appended
    return out


def nodeadm_base_runtime_spec(user_data: str) -> dict:
    """What nodeadm writes to /etc/containerd/base-runtime-spec.json for this user data."""
    part = user_data.split("Content-Type: application/node.eks.aws", 1)[1].split("\n--", 1)[0]
    override = yaml.safe_load(part)["spec"].get("containerd", {}).get("baseRuntimeSpec")
    if not override:
        return DEFAULT_SPEC
    return _through_go_json(_mergo_override(_through_go_json(DEFAULT_SPEC), _through_go_json(override)))


def containerd_rlimit_problems(spec: dict) -> list[str]:
    """containerd's json decode into specs.POSIXRlimit (Hard, Soft uint64)."""
    return [f"{r['type']}.{k}={r[k]} is not a uint64" for r in spec["process"]["rlimits"]
            for k in ("soft", "hard") if not (isinstance(r[k], int) and 0 <= r[k] <= UINT64_MAX)]


def _rlimits(spec: dict) -> dict[str, dict]:
    return {r["type"]: r for r in spec["process"]["rlimits"]}


def test_efa_nodes_get_the_memlock_limit_and_keep_nodeadms_nofile():
    spec = nodeadm_base_runtime_spec(node_config_user_data(raid0=True, memlock=True))
    assert containerd_rlimit_problems(spec) == []
    assert _rlimits(spec) == {"RLIMIT_MEMLOCK": EFA_MEMLOCK_RLIMIT, "RLIMIT_NOFILE": NODEADM_DEFAULT_RLIMITS[0]}
    assert EFA_MEMLOCK_BYTES > 2**57  # beyond any x86-64 address space: in effect unlimited


def test_rlim_infinity_would_not_survive_nodeadms_merge():
    """Why the limit is not 2^64-1: written back as 18446744073709552000, which no uint64 holds."""
    spec = nodeadm_base_runtime_spec(node_config_user_data(raid0=False, memlock=True).replace(
        str(EFA_MEMLOCK_BYTES), str(UINT64_MAX)))
    assert containerd_rlimit_problems(spec) == [
        "RLIMIT_MEMLOCK.soft=18446744073709552000 is not a uint64",
        "RLIMIT_MEMLOCK.hard=18446744073709552000 is not a uint64"]


def test_a_memlock_list_without_nofile_would_drop_nodeadms_default():
    """The merge replaces the list: RLIMIT_NOFILE must be listed again (it is)."""
    lone = {"spec": {"containerd": {"baseRuntimeSpec": {"process": {"rlimits": [EFA_MEMLOCK_RLIMIT]}}}}}
    user_data = "Content-Type: application/node.eks.aws\n" + yaml.safe_dump(lone) + "\n--X--\n"
    assert set(_rlimits(nodeadm_base_runtime_spec(user_data))) == {"RLIMIT_MEMLOCK"}


@pytest.mark.parametrize("raid0,memlock", [(True, False), (False, True), (True, True)])
def test_node_config_parts(raid0, memlock):
    text = node_config_user_data(raid0=raid0, memlock=memlock)
    spec = yaml.safe_load(text.split("Content-Type: application/node.eks.aws", 1)[1].split("\n--", 1)[0])["spec"]
    assert ("instance" in spec) is raid0 and ("containerd" in spec) is memlock


def test_every_efa_launch_template_sets_the_memlock_limit(variant):
    groups = {g.name: g for g in variant.env.gpu_node_groups}
    seen = set()
    for resource in variant.resources("cluster", "AWS::EKS::Nodegroup").values():
        props = resource["Properties"]
        group = groups.get((props.get("Labels") or {}).get("raytrain.io/node-group"))
        if group is None or not group.efa_per_node:
            continue
        logical_id = props["LaunchTemplate"]["Id"]["Ref"]
        data = variant.json("cluster")["Resources"][logical_id]["Properties"]["LaunchTemplateData"]
        spec = nodeadm_base_runtime_spec(data["UserData"]["Fn::Base64"])
        assert _rlimits(spec)["RLIMIT_MEMLOCK"] == EFA_MEMLOCK_RLIMIT, group.name
        assert containerd_rlimit_problems(spec) == []
        seen.add(group.name)
    assert seen == {g.name for g in groups.values() if g.efa_per_node}
