"""`raytrain-eks verify` against moto's server, botocore Stubbers where moto lacks the API, a
local HTTP server of Helm chart indexes and a real registry (see verify_doubles.py): a spec that
passes every check, then each kind of failure, one line with its fix, exit 2."""
from __future__ import annotations

import copy
import json
from dataclasses import replace
import tempfile
import tomllib
from pathlib import Path

import pytest
from botocore.stub import Stubber

from environment import environment_from_dict
from environment.addons import ADDONS, EKS_ADDONS
from raytrain_eks.verify import checks as verify
from raytrain_eks.verify import account as verify_account
from raytrain_eks.verify.chart_index import IndexCache, http_fetch, matches
from raytrain_eks.cli import main
import raytrain_eks.verify as verify_command
from toml_writer import toml_text
from verify_doubles import (
    MOTO_ACCOUNT, SplitEc2, SplitEks, create_bootstrap_stack, serve_directory, start_moto, stub_eks, stub_quotas,
    write_chart_indexes,
)

REPO = Path(__file__).resolve().parents[3]
REGION = "us-east-1"
K8S = "1.36"
STANDARD, GPU = "L-1216C47A", "L-DB2E81BA"
ENOUGH = {STANDARD: 8.0, GPU: 96.0}  # m7i.2xlarge x 1; g6.12xlarge x 2 (max_nodes)
PINNED = {a.chart: [a.default_version] for a in ADDONS}


@pytest.fixture(scope="module")
def moto():
    import contextlib

    from botocore.exceptions import ClientError

    server, moto = start_moto()
    # moto keeps its backends per process, not per server: a second module using this fixture
    # (test_verify_existing.py) finds the stack and the role already made
    with contextlib.suppress(ClientError):
        create_bootstrap_stack(moto, REGION, 29)
    with contextlib.suppress(ClientError):
        moto.client("iam", REGION).create_role(RoleName="admin", AssumeRolePolicyDocument="{}")
    yield moto
    server.stop()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from oci_registry import OCI_MANIFEST, REGISTRY_BINARY, LocalRegistry, start_registry, stop

    if REGISTRY_BINARY is None:
        pytest.fail("docker-registry is not installed: run scripts/install-system-deps.sh")
    workdir = tmp_path_factory.mktemp("verify-registry")
    proc, url = start_registry(workdir)
    registry = LocalRegistry(url=url, data_dir=workdir / "data")
    name = "deep-learning-containers/ray"
    registry.digests = {"v1": registry.push_image(name, "train-ml-cuda-v1.1.0"),
                        "arm64": registry.push_image(name, "arm64", content=b"arm\n", media_type=OCI_MANIFEST)}
    arm = registry.digests["arm64"]
    registry.digests["arm-only"] = registry.push_index(
        name, "arm-only", {"arm64": (arm, registry.manifest_size(name, arm, OCI_MANIFEST))})
    yield registry
    stop(proc)


@pytest.fixture
def charts(tmp_path):
    """A chart server with every pinned version; tests rewrite its indexes."""
    root = tmp_path / "charts"
    write_chart_indexes(root, PINNED)
    server, url = serve_directory(root)
    yield root, url
    server.shutdown()


def raw_spec(registry) -> dict:
    raw = tomllib.loads((REPO / "environment.toml").read_text())
    raw["cluster"].update(account=MOTO_ACCOUNT, admin_principal_arns=[f"arn:aws:iam::{MOTO_ACCOUNT}:role/admin"])
    raw["image"].update(repository=f"{registry.host}/deep-learning-containers/ray", digest=registry.digests["v1"])
    return raw


def write_spec(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "environment.toml"
    path.write_text(toml_text(raw))
    return path


def use_clients(monkeypatch, moto, *, eks=None, quotas=None, reservations=None):
    """verify's clients: moto for STS, CloudFormation, EC2 offerings; stubs for the rest."""
    def make(service: str, region: str):
        if service == "eks":
            return SplitEks(moto.client("eks", region), eks or stub_eks(region, K8S))
        if service == "service-quotas":
            return quotas or stub_quotas(region, ENOUGH)
        if service == "ec2":
            return SplitEc2(moto.client("ec2", region), reservations or moto.client("ec2", region))
        return moto.client(service, region)
    monkeypatch.setattr(verify_command, "make_client", make)
    monkeypatch.setattr(verify_command, "ROOT", Path(tempfile.mkdtemp()))  # where a pass is recorded


def run_verify(capsys, spec: Path, chart_url: str) -> tuple[int, list[str], str]:
    rc = main(["verify", "--env", str(spec), "--helm-repo-mirror", chart_url, "--timeout", "60"])  # per request: a bound on a hang
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


def test_a_good_spec_passes_every_check(tmp_path, moto, registry, charts, monkeypatch, capsys):
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw_spec(registry)), charts[1])
    assert failures(lines) == [] and rc == 0 and err == ""
    checks = {line.split()[1].rstrip(":") for line in lines if line.startswith("ok")}
    assert checks == {"account", "bootstrap", "leftover", "eks-addon", "helm-chart", "admins", "zones", "gpu-az",
                      "quota", "image", "node-groups"}
    assert sum(line.startswith("ok    eks-addon") for line in lines) == len(EKS_ADDONS)
    assert "checks passed (cdk deploy of account" in lines[-1]
    # the pass is recorded for this spec and account: app.py lets the cluster stack deploy
    from infra import verify_gate

    env = environment_from_dict(raw_spec(registry), str(tmp_path / "environment.toml"))
    recorded = verify_gate.stamp_path(verify_command.ROOT, env).read_text()
    assert json.loads(recorded)["account"] == MOTO_ACCOUNT
    assert verify_gate.refusal(env, recorded, verify_gate.now(), MOTO_ACCOUNT) is None
    # no cluster yet: no group exists, so the first deploy writes every desired size
    assert verify_gate.recorded_groups(recorded) == frozenset()
    assert any("group gpu (g6.12xlarge/on-demand/" in line and "does not exist yet" in line for line in lines)


def test_verify_records_the_gpu_groups_that_exist_with_the_same_create_only_inputs(tmp_path, moto, registry, charts,
                                                                                   monkeypatch, capsys):
    # deployed clusters as CloudFormation left them: generated node group names, the tags the GPU
    # construct writes; in "replaced" the group was made for another instance type, so this
    # spec replaces it (a creation) and it does not count
    from infra import verify_gate
    from infra.verify_gate import identity_tags

    use_clients(monkeypatch, moto)
    eks = moto.client("eks", REGION)
    for cluster in ("deployed", "replaced"):
        raw = raw_spec(registry)
        raw["cluster"]["name"] = cluster
        env = environment_from_dict(raw, str(tmp_path / "environment.toml"))
        [gpu] = env.gpu_node_groups
        made_from = gpu if cluster == "deployed" else replace(gpu, instance_type="g6.48xlarge")
        eks.create_cluster(name=cluster, roleArn=f"arn:aws:iam::{MOTO_ACCOUNT}:role/c",
                           resourcesVpcConfig={"subnetIds": ["subnet-1"]})
        for name, tags in [("GpugpuNodegroup-7Hq2", identity_tags(made_from, env.cluster.gpu_availability_zone, env.cluster.availability_zones)),
                           ("SystemNodegroup-4b1Z", {})]:
            eks.create_nodegroup(clusterName=cluster, nodegroupName=name, subnets=["subnet-1"],
                                 nodeRole=f"arn:aws:iam::{MOTO_ACCOUNT}:role/n", tags=tags,
                                 scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 1})
        rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
        assert rc == 0, lines
        recorded = verify_gate.stamp_path(verify_command.ROOT, env).read_text()
        [line] = [line for line in lines if "node-groups" in line]
        if cluster == "deployed":
            assert verify_gate.recorded_groups(recorded) == frozenset({"gpu"})
            assert line.startswith("ok    node-groups: group gpu exists (g6.12xlarge/on-demand/")
        else:
            assert verify_gate.recorded_groups(recorded) == frozenset()
            assert "does not exist yet: a deploy creates it with 0 node(s)" in line


def assert_one_failure(rc: int, lines: list[str], err: str, *expected: str) -> str:
    [line] = failures(lines)
    assert rc == 2 and " -- fix: " in line
    for text in expected:
        assert text in line
    assert err.count("\n") == 1 and "checks failed" in err
    return line


def test_an_addon_pin_eks_does_not_offer_prints_the_offered_versions(tmp_path, moto, registry, charts,
                                                                       monkeypatch, capsys):
    offered = {"vpc-cni": ["v1.21.1-eksbuild.1", "v1.20.4-eksbuild.2"]}
    use_clients(monkeypatch, moto, eks=stub_eks(REGION, K8S, offered))
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw_spec(registry)), charts[1])
    assert_one_failure(rc, lines, err, "vpc-cni v1.20.1-eksbuild.3 is not offered for Kubernetes 1.36",
                       "v1.21.1-eksbuild.1, v1.20.4-eksbuild.2", "environment/addons.py EKS_ADDONS")


def test_a_chart_version_missing_from_its_index(tmp_path, moto, registry, charts, monkeypatch, capsys):
    root, url = charts
    write_chart_indexes(root, {**PINNED, "aws-efa-k8s-device-plugin": ["v0.5.29", "v0.5.30"]})
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw_spec(registry)), url)
    assert_one_failure(rc, lines, err, "aws-efa-k8s-device-plugin v0.5.32 is not in",
                       "(newest: v0.5.30, v0.5.29)", "set versions.efa_device_plugin")


def test_an_unreachable_chart_repository_is_one_line_per_chart(registry, tmp_path):
    env = environment_from_dict(raw_spec(registry), "environment.toml")
    found = verify.check_charts(env, IndexCache(http_fetch(2)), mirror="http://127.0.0.1:9")
    assert found and all(not f.ok and "could not read" in f.message for f in found)


def test_helm_resolves_an_exact_version_with_or_without_its_v():
    # helm/helm pkg/repo/index.go IndexFile.Get: exact string, else the semver constraint "=x.y.z"
    assert matches("v0.5.32", "0.5.32") and matches("0.5.32", "v0.5.32") and matches("1.7.0", "1.7.0")
    assert not matches("0.5.32", "0.5.3") and not matches("1.7.0", "1.7.0-rc.1")


def test_a_zone_eks_does_not_support_and_the_gpu_type_not_offered_there(tmp_path, moto, registry, charts,
                                                                         monkeypatch, capsys):
    # moto's us-east-1e is zone use1-az3: EKS refuses a cluster subnet there, and moto's
    # offerings (from EC2's own data) have neither m7i.2xlarge nor g6.12xlarge in it
    raw = raw_spec(registry)
    raw["cluster"].update(availability_zones=["us-east-1a", "us-east-1e"], gpu_availability_zone="us-east-1e")
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    [zone, system, gpu] = failures(lines)
    assert rc == 2 and "3 of" in err
    assert zone.startswith("FAIL  zones: us-east-1e is zone use1-az3 in this account, where EKS creates no cluster")
    assert "replace us-east-1e in cluster.availability_zones" in zone and "us-east-1b" in zone
    assert "system nodes: m7i.2xlarge is not offered in us-east-1e (use1-az3)" in system
    assert "g6.12xlarge is not offered in us-east-1e" in gpu and "set cluster.gpu_availability_zone" in gpu


def test_the_eks_zone_list_is_read_by_zone_id_not_name():
    # the same name is another zone in another account: only the id decides
    from raytrain_eks.verify.checks import check_zones

    class Ec2:
        def __init__(self, ids):
            self.ids = ids

        def describe_availability_zones(self):
            return {"AvailabilityZones": [{"ZoneName": n, "ZoneId": i} for n, i in self.ids.items()]}

        def describe_instance_type_offerings(self, **kwargs):
            return {"InstanceTypeOfferings": [{"Location": i} for i in self.ids.values()]}

    env = environment_from_dict(raw_spec_offline(), "environment.toml")
    good = check_zones(env, Ec2({"us-east-1a": "use1-az6", "us-east-1b": "use1-az1", "us-east-1c": "use1-az3"}))
    assert [f.ok for f in good] == [True]
    [bad] = check_zones(env, Ec2({"us-east-1a": "use1-az3", "us-east-1b": "use1-az1", "us-east-1c": "use1-az6"}))
    assert not bad.ok and "us-east-1a is zone use1-az3" in bad.message and "us-east-1c" in bad.fix


def test_an_admin_principal_that_does_not_exist(tmp_path, moto, registry, charts, monkeypatch, capsys):
    raw = raw_spec(registry)
    missing = f"arn:aws:iam::{MOTO_ACCOUNT}:user/team/typo-admin"
    raw["cluster"]["admin_principal_arns"] = [f"arn:aws:iam::{MOTO_ACCOUNT}:role/admin", missing]
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    line = assert_one_failure(rc, lines, err, f"admins: {missing}: no such IAM user in this account",
                              "correct cluster.admin_principal_arns", "aws iam get-user --user-name typo-admin")
    assert line.startswith("FAIL  admins")


def test_an_admin_principal_of_another_account_is_not_looked_up_here(tmp_path, moto, registry, charts, monkeypatch,
                                                                      capsys):
    # EKS accepts an access entry for another account's principal; IAM GetRole with these
    # credentials would say NoSuchEntity for it (moto's IAM, like IAM, is per account)
    raw = raw_spec(registry)
    other = "arn:aws:iam::444455556666:role/platform-admin"
    raw["cluster"]["admin_principal_arns"] = [f"arn:aws:iam::{MOTO_ACCOUNT}:role/admin", other]
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    assert rc == 0, lines
    assert any(f"admins: {other}: not checked here (account 444455556666" in line for line in lines)


def raw_spec_offline() -> dict:
    raw = tomllib.loads((REPO / "environment.toml").read_text())
    raw["cluster"].update(account=MOTO_ACCOUNT, admin_principal_arns=[f"arn:aws:iam::{MOTO_ACCOUNT}:role/admin"])
    return raw


def test_a_vcpu_quota_below_the_groups_at_max_size(tmp_path, moto, registry, charts, monkeypatch, capsys):
    use_clients(monkeypatch, moto, quotas=stub_quotas(REGION, {STANDARD: 8.0, GPU: 64.0}))
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw_spec(registry)), charts[1])
    assert_one_failure(rc, lines, err, "G and VT vCPUs", "quota 64, needed 96", "gpu 2 x g6.12xlarge",
                       f"request {GPU} >= 96")


def reservation_stub(reply: dict | None):
    import boto3

    client = boto3.client("ec2", region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t")
    stub = Stubber(client)
    if reply is None:
        stub.add_client_error("describe_capacity_reservations", "InvalidCapacityReservationId.NotFound",
                              "The capacity reservation ID 'cr-0123456789abcdef0' does not exist")
    else:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [reply]})
    stub.activate()
    return client


@pytest.mark.parametrize("reply, expected", [
    (None, "is not in this account and region"),
    ({"CapacityReservationId": "cr-0123456789abcdef0", "InstanceType": "g6.12xlarge",
      "AvailabilityZone": "us-east-1b", "ReservationType": "default", "State": "active",
      "TotalInstanceCount": 1, "AvailableInstanceCount": 1},
     "it is in us-east-1b, the GPU AZ is us-east-1a; it holds 1 instances, max_nodes is 2"),
])
def test_a_reservation_that_does_not_fit_its_group(reply, expected, tmp_path, moto, registry, charts,
                                                   monkeypatch, capsys):
    raw = raw_spec(registry)
    raw["gpu_node_groups"][0].update(capacity="capacity-reservation", capacity_reservation_id="cr-0123456789abcdef0")
    use_clients(monkeypatch, moto, reservations=reservation_stub(reply))
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    assert_one_failure(rc, lines, err, "group gpu: cr-0123456789abcdef0", expected)


def test_no_or_an_old_bootstrap_stack(moto, registry):
    raw = raw_spec(registry)
    raw["cluster"].update(region="us-west-2", availability_zones=["us-west-2a", "us-west-2b"],
                          gpu_availability_zone="us-west-2a")
    env = environment_from_dict(raw, "environment.toml")
    cfn = moto.client("cloudformation", "us-west-2")
    [missing] = verify_account.check_bootstrap(env, cfn)
    assert not missing.ok and missing.fix == f"cdk bootstrap aws://{MOTO_ACCOUNT}/us-west-2"
    create_bootstrap_stack(moto, "us-west-2", 5)
    [old] = verify_account.check_bootstrap(env, cfn)
    assert not old.ok and "bootstrap version 5, this CDK needs 6" in old.message


def test_credentials_of_another_account(tmp_path, moto, registry, charts, monkeypatch, capsys):
    raw = raw_spec(registry)
    raw["cluster"]["account"] = "111122223333"
    raw["cluster"]["admin_principal_arns"] = ["arn:aws:iam::111122223333:role/admin"]
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    failed = failures(lines)
    assert rc == 2 and any(f"credentials are for account {MOTO_ACCOUNT}" in line for line in failed)


@pytest.mark.parametrize("digest, expected", [
    ("", "is not pinned (image.digest is empty) -- fix: raytrain-eks lock"),
    ("arm-only", "is an index without linux/amd64 (it has: linux/arm64)"),
    ("sha256:" + "0" * 64, "raytrain-eks lock --env"),
])
def test_an_image_digest_that_is_missing_unknown_or_not_amd64(digest, expected, tmp_path, moto, registry, charts,
                                                             monkeypatch, capsys):
    raw = raw_spec(registry)
    raw["image"]["digest"] = registry.digests.get(digest, digest)
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    assert_one_failure(rc, lines, err, "image: ", expected)


def test_a_call_the_credentials_may_not_make_is_one_line_naming_the_permission(tmp_path, moto, registry, charts,
                                                                              monkeypatch, capsys):
    import boto3

    denied = boto3.client("eks", region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t")
    stub = Stubber(denied)
    stub.add_client_error("describe_addon_versions", "AccessDeniedException", "not authorized", 403)
    stub.activate()
    use_clients(monkeypatch, moto, eks=denied)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw_spec(registry)), charts[1])
    assert_one_failure(rc, lines, err, "eks-addon: could not check: AccessDeniedException",
                       "allow eks:DescribeAddonVersions")


def test_capacity_blocks_are_not_counted_against_on_demand_quotas(registry):
    raw = copy.deepcopy(raw_spec(registry))
    raw["gpu_node_groups"][0].update(capacity="capacity-block", capacity_reservation_id="cr-0fedcba9876543210")
    needs = verify.vcpu_needs(environment_from_dict(raw, "environment.toml"))
    assert needs == {STANDARD: [("system 1 x m7i.2xlarge", 8)]}


def test_no_credentials_is_one_line_per_check_not_a_traceback():
    from botocore.exceptions import NoCredentialsError

    def check():
        raise NoCredentialsError()

    [finding] = verify.run_checks([("quota", check)])
    assert not finding.ok and finding.line() == (
        "FAIL  quota: could not check: Unable to locate credentials -- fix: configure AWS credentials "
        "(aws configure / AWS_PROFILE)")


def test_what_a_first_deploy_would_collide_with(tmp_path, moto, registry, charts, monkeypatch, capsys):
    # CloudFormation creates a named resource and fails if the name is taken: a bucket kept by an
    # earlier deploy (the storage stack retains it), a log group of the cluster's name
    raw = raw_spec(registry)
    raw["cluster"]["name"] = "leftovers"
    env = environment_from_dict(raw, "environment.toml")
    moto.client("s3", REGION).create_bucket(Bucket=env.bucket_name)
    moto.client("logs", REGION).create_log_group(logGroupName="/aws/eks/leftovers/cluster")
    use_clients(monkeypatch, moto)
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    found = failures(lines)
    assert rc == 2 and len(found) == 2
    assert f"bucket {env.bucket_name} already exists" in found[0] and "storage.existing_bucket = true" in found[0]
    assert "aws logs delete-log-group --log-group-name /aws/eks/leftovers/cluster" in found[1]
    raw["storage"]["existing_bucket"] = True
    moto.client("logs", REGION).delete_log_group(logGroupName="/aws/eks/leftovers/cluster")
    # the adopted bucket keeps its retained policy (the stack cannot add one): verify reads it
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    assert_one_failure(rc, lines, err, f"bucket {env.bucket_name} (storage.existing_bucket = true) has no policy "
                       "denying non-TLS access", "aws s3api put-bucket-policy")
    moto.client("s3", REGION).put_bucket_policy(Bucket=env.bucket_name, Policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{  # CDK's enforceSSL statement, as the first deploy wrote it
            "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "s3:*", "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            "Resource": [f"arn:aws:s3:::{env.bucket_name}", f"arn:aws:s3:::{env.bucket_name}/*"]}]}))
    rc, lines, err = run_verify(capsys, write_spec(tmp_path, raw), charts[1])
    assert rc == 0 and any("adopted by the storage stack" in line for line in lines)
    assert any("its kept policy denies non-TLS access" in line for line in lines)


def test_a_spot_group_is_counted_against_the_spot_quota_it_draws_from(registry):
    # EC2 counts spot vCPUs against "All G and VT Spot Instance Requests" (L-3819A6DF), a quota
    # of its own (0 in many accounts), never against the On-Demand one
    raw = copy.deepcopy(raw_spec(registry))
    raw["gpu_node_groups"][0].update(capacity="spot", instance_types=["g5.12xlarge"])
    env = environment_from_dict(raw, "environment.toml")
    needs = verify.vcpu_needs(env)
    assert needs == {STANDARD: [("system 1 x m7i.2xlarge", 8)],
                     "L-3819A6DF": [("gpu 2 x g6.12xlarge/g5.12xlarge (spot)", 96)]}
    found = verify.check_quotas(env, stub_quotas(REGION, {STANDARD: 8.0, "L-3819A6DF": 0.0}))
    assert [f.ok for f in found] == [True, False]
    assert "All G and VT Spot Instance Requests, L-3819A6DF" in found[1].line()
    assert "request L-3819A6DF >= 96" in found[1].line()
