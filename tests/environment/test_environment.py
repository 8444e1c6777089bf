"""The environment spec: parsing, derived values, and one-line refusals of bad input."""
from __future__ import annotations

import copy
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from environment import SpecError, UnlockedImageWarning, environment_from_dict, load_environment
from environment.instances import INSTANCE_TYPES
from spec_template import template_raw

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw() -> dict:
    return template_raw()


def test_shipped_environment_loads_and_derives_the_reference_cluster():
    env = load_environment(ROOT / "environment.toml")
    gpu = env.primary_gpu_group
    assert (gpu.instance_type, gpu.gpus_per_node, gpu.efa_per_node) == ("g6.12xlarge", 4, 1)
    assert env.world_size == 8
    assert (gpu.pod_cpu, gpu.pod_memory_gib) == (40, 160)  # the AWS sample's worker pod
    assert gpu.taints == ({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},)
    assert gpu.labels["raytrain.io/node-group"] == "gpu"
    assert env.cluster.gpu_availability_zone in env.cluster.availability_zones


def test_derived_values_follow_the_instance_type(raw):
    changed = copy.deepcopy(raw)
    changed["gpu_node_groups"][0].update(instance_type="p5.48xlarge", max_nodes=4)
    env = environment_from_dict(changed)
    assert env.world_size == 32
    assert env.primary_gpu_group.efa_per_node == 32
    # a job runs on max_nodes; with no job only the system node is paid for (min_nodes 0)
    assert env.hourly_cost_usd == pytest.approx(4 * INSTANCE_TYPES["p5.48xlarge"].hourly_usd_estimate
                                                + INSTANCE_TYPES["m7i.2xlarge"].hourly_usd_estimate)
    assert env.idle_hourly_cost_usd == pytest.approx(INSTANCE_TYPES["m7i.2xlarge"].hourly_usd_estimate)


def test_price_override_changes_cost(raw):
    changed = copy.deepcopy(raw)
    changed["prices"] = {"g6.12xlarge": 1.0, "m7i.2xlarge": 0.5}
    assert environment_from_dict(changed).hourly_cost_usd == pytest.approx(2.5)


def test_image_reference_pins_digest_once_locked(raw):
    changed = copy.deepcopy(raw)
    digest = "sha256:" + "ab" * 32
    changed["image"]["digest"] = digest
    env = environment_from_dict(changed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert env.image.reference == f"{env.image.repository}@{digest}"


def test_unlocked_image_warns_loudly(raw):
    # unlocked explicitly: the pipeline's Synth runs these tests on a spec it has just locked
    unlocked = copy.deepcopy(raw)
    unlocked["image"]["digest"] = ""
    env = environment_from_dict(unlocked)
    with pytest.warns(UnlockedImageWarning, match="not locked to a digest"):
        assert env.image.reference.endswith(":" + env.image.tag)


def test_spec_hash_ignores_comments_but_not_values(tmp_path):
    text = (ROOT / "environment.toml").read_text()
    raw = tomllib.loads(text)  # the committed spec, whatever a deployment filled in
    commented = tmp_path / "env.toml"
    commented.write_text("# another comment\n" + text)
    assert load_environment(commented).spec_hash == environment_from_dict(raw).spec_hash
    changed = copy.deepcopy(raw)
    changed["gpu_node_groups"][0]["root_volume_gib"] = 300
    assert environment_from_dict(changed).spec_hash != environment_from_dict(raw).spec_hash


def test_bucket_name_is_derived_unless_given(raw):
    changed = copy.deepcopy(raw)
    changed["cluster"]["account"] = "111122223333"
    env = environment_from_dict(changed)
    assert env.bucket_name == "raytrain-raytrain-111122223333-us-east-1"
    assert env.storage_uri == "s3://raytrain-raytrain-111122223333-us-east-1/runs"
    changed["storage"]["bucket_name"] = "my-ckpts"
    assert environment_from_dict(changed).bucket_name == "my-ckpts"


def test_two_accounts_never_derive_the_same_bucket(raw):
    names = set()
    for account in ("111122223333", "444455556666"):
        changed = copy.deepcopy(raw)
        changed["cluster"]["account"] = account
        names.add(environment_from_dict(changed).bucket_name)
    assert len(names) == 2


def test_a_long_cluster_name_derives_a_valid_unique_bucket_name(raw):
    from environment.rules import bucket_name_problem

    derived = []
    for name in ("a" * 39 + "b", "a" * 39 + "c"):
        changed = copy.deepcopy(raw)
        changed["cluster"].update(name=name, account="111122223333")
        derived.append(environment_from_dict(changed).bucket_name)
    assert all(len(n) <= 63 and bucket_name_problem(n) == "" for n in derived)
    assert derived[0] != derived[1] and all(n.endswith("-111122223333-us-east-1") for n in derived)


def test_derived_and_explicit_bucket_names_pass_one_validator(raw):
    changed = copy.deepcopy(raw)
    changed["storage"]["bucket_name"] = "raytrain--x"  # ok for the regex, '--' is allowed by S3
    assert environment_from_dict(changed).bucket_name == "raytrain--x"
    changed["storage"]["bucket_name"] = "a..b"
    with pytest.raises(SpecError, match=r"storage.bucket_name: 'a..b' is not a valid S3 bucket name"):
        environment_from_dict(changed)


# (mutation, expected one-line message). Each is a mistake a user can make.
BAD_SPECS = [
    (lambda r: r["gpu_node_groups"][0].update(instance_type="g6.12xlarg"),
     "environment.toml: gpu_node_groups[0].instance_type: 'g6.12xlarg' is not a known GPU instance type (known: "),
    (lambda r: r["gpu_node_groups"][0].update(instance_type="m7i.xlarge"),
     "gpu_node_groups[0].instance_type: 'm7i.xlarge' is not a known GPU instance type (a CPU type: use system_node_group)"),
    (lambda r: r["system_node_group"].update(instance_type="g6.12xlarge"),
     "system_node_group.instance_type: 'g6.12xlarge' is not a known CPU instance type"),
    (lambda r: r["cluster"].update(gpu_availability_zone="us-east-1c"),
     "cluster.gpu_availability_zone: 'us-east-1c' must be one of cluster.availability_zones (us-east-1a, us-east-1b)"),
    (lambda r: r["cluster"].update(availability_zones=["us-east-1a"]),
     "cluster.availability_zones: ['us-east-1a'] must list at least two distinct AZs"),
    (lambda r: r["cluster"].update(availability_zones=["us-east-1a", "eu-west-1b"]),
     "cluster.availability_zones[1]: 'eu-west-1b' is not an AZ of region us-east-1"),
    (lambda r: r["cluster"].update(region="us-east"),
     "cluster.region: 'us-east' is not an AWS region name"),
    (lambda r: r["cluster"].update(account="1234"),
     "cluster.account: '1234' is not a 12-digit AWS account id (or empty)"),
    (lambda r: r["cluster"].update(kubernetes_version="1.20"),
     "cluster.kubernetes_version: '1.20' is not supported by this CDK app (supported: 1.36;"),
    (lambda r: r["cluster"].update(public_access_cidrs=[]),
     "cluster.public_access_cidrs: [] must list who may reach the public API endpoint (endpoint_access = "
     "'public_and_private'); write [\"0.0.0.0/0\"] to open it to everyone"),
    (lambda r: r["cluster"].update(public_access_cidrs=["10.0.0.1/8"]),
     "cluster.public_access_cidrs[0]: '10.0.0.1/8' is not an IPv4 CIDR (e.g. 203.0.113.0/24)"),
    (lambda r: r["cluster"].update(endpoint_access="private"),
     "cluster.public_access_cidrs: ['0.0.0.0/0'] must be empty with endpoint_access = 'private'"),
    (lambda r: r["cluster"].update(endpoint_access="open"),
     "cluster.endpoint_access: 'open' is not allowed (allowed: public, private, public_and_private)"),
    (lambda r: r["cluster"].update(name="Ray_Train"),
     "cluster.name: 'Ray_Train' is not a lower-case name"),
    (lambda r: r["cluster"].update(admin_principal_arns=["admin"]),
     "cluster.admin_principal_arns[0]: 'admin' is not an IAM role or user ARN"),
    (lambda r: r["cluster"].update(instance_typo="x"),
     "cluster.instance_typo: 'instance_typo' is not a known field (known: "),
    (lambda r: r.update(clustr={}),
     "clustr: 'clustr' is not a known section (known: "),
    (lambda r: r["gpu_node_groups"][0].update(desired_nodes=5),
     "gpu_node_groups[0].desired_nodes: 5 must be between min_nodes (0) and max_nodes (2)"),
    (lambda r: r["gpu_node_groups"][0].update(desired_nodes=1),
     "gpu_node_groups[0].desired_nodes: 1 must equal min_nodes (0) while min_nodes < max_nodes: cluster-autoscaler"),
    (lambda r: r["gpu_node_groups"][0].update(placement_group="my-pg"),
     "gpu_node_groups[0].placement_group: 'my-pg' is only for capacity = capacity-reservation"),
    (lambda r: r["storage"].update(existing_bucket=True),
     "storage.existing_bucket: True needs the bucket's name: set storage.bucket_name (or cluster.account)"),
    (lambda r: r["gpu_node_groups"][0].update(desired_nodes="2"),
     "gpu_node_groups[0].desired_nodes: '2' is not allowed (expected an integer)"),
    (lambda r: r["gpu_node_groups"][0].update(capacity="preemptible"),
     "gpu_node_groups[0].capacity: 'preemptible' is not allowed (allowed: on-demand, spot, capacity-reservation, "
     "capacity-block)"),
    (lambda r: r["gpu_node_groups"][0].update(capacity="capacity-block"),
     "gpu_node_groups[0].capacity_reservation_id: '' is not a capacity reservation id (cr- and 17 hex digits), required for capacity-block"),
    (lambda r: r["gpu_node_groups"][0].update(capacity_reservation_id="cr-0123456789abcdef0"),
     "gpu_node_groups[0].capacity_reservation_id: 'cr-0123456789abcdef0' must be empty for on-demand capacity"),
    (lambda r: r["gpu_node_groups"][0].update(root_volume_gib=20),
     "gpu_node_groups[0].root_volume_gib: 20 must be between 50 and 16384"),
    (lambda r: r.update(gpu_node_groups=[]),
     "gpu_node_groups: [] has no group: list at least one [[gpu_node_groups]] table"),
    (lambda r: r["gpu_node_groups"].append(dict(r["gpu_node_groups"][0])),
     "gpu_node_groups[1].name: 'gpu' must be a unique lower-case name"),
    (lambda r: r["image"].update(digest="sha256:1234"),
     "image.digest: 'sha256:1234' is not sha256:<64 hex digits>"),
    (lambda r: r["image"].update(ray_version="latest"),
     "image.ray_version: 'latest' is not a Ray version (e.g. 2.58.0)"),
    (lambda r: r["versions"].update(kuberay_operator="latest"),
     "versions.kuberay_operator: 'latest' is not a pinned version (e.g. 1.7.0)"),
    (lambda r: r["storage"].update(bucket_name="My_Bucket"),
     "storage.bucket_name: 'My_Bucket' is not a valid S3 bucket name"),
    (lambda r: r["storage"].update(prefix="/runs/"),
     "storage.prefix: '/runs/' is not a key prefix"),
    (lambda r: r["storage"].update(noncurrent_version_days=0),
     "storage.noncurrent_version_days: 0 must be between 1 and 3650"),
    (lambda r: r["storage"].update(shared_path="/fsx/runs"),
     "storage.shared_claim: '' is required with storage.shared_path / shared_claim (set both, or neither)"),
    (lambda r: r["storage"].update(shared_claim="fsx-runs"),
     "storage.shared_path: '' is required with storage.shared_path / shared_claim (set both, or neither)"),
    (lambda r: r["storage"].update(shared_path="fsx/runs", shared_claim="fsx-runs"),
     "storage.shared_path: 'fsx/runs' is not an absolute path"),
    (lambda r: r["storage"].update(shared_path="/fsx/../etc", shared_claim="fsx-runs"),
     "storage.shared_path: '/fsx/../etc' is not an absolute path"),
    (lambda r: r["storage"].update(shared_path="/fsx/runs", shared_claim="FSx_Runs"),
     "storage.shared_claim: 'FSx_Runs' is not a PersistentVolumeClaim name"),
    (lambda r: r["ray"].update(namespace="kube-system"),
     "ray.namespace: 'kube-system' is reserved"),
    (lambda r: r["pipeline"].update(connection_arn="arn:aws:s3:::bucket"),
     "pipeline.connection_arn: 'arn:aws:s3:::bucket' is not a CodeConnections connection ARN"),
    (lambda r: r["pipeline"].update(watch_schedule="every hour"),
     "pipeline.watch_schedule: 'every hour' is not an EventBridge schedule"),
    (lambda r: r["pipeline"].update(min_tokens_per_s_fraction=0),
     "pipeline.min_tokens_per_s_fraction: 0.0 must be > 0 and <= 2"),
    (lambda r: r["pipeline"].update(max_eval_loss_increase="0.1"),
     "pipeline.max_eval_loss_increase: '0.1' is not allowed (expected a number)"),
    (lambda r: r.update(prices={"g6.12xlarge": -1}),
     "prices.g6.12xlarge: -1 must be a positive number (USD per hour)"),
    (lambda r: r["queueing"].update(local_queue="default"),
     "queueing.local_queue: 'default' is not allowed (a lower-case Kubernetes name, not 'default'"),
    (lambda r: r["queueing"].update(priorities={"short": "high"}),
     "queueing.priorities.short: 'high' must be an integer (int32; higher is admitted first)"),
    (lambda r: r["queueing"].update(priorities={"short": 2**31}),
     "queueing.priorities.short: 2147483648 must be an integer (int32; higher is admitted first)"),
    (lambda r: r["queueing"].update(job_priorities={"smoke": "urgent"}),
     "queueing.job_priorities.smoke: 'urgent' is not a priority class of queueing.priorities (experiment, short)"),
    (lambda r: r["queueing"].update(default_priority="low"),
     "queueing.default_priority: 'low' is not a priority class of queueing.priorities (experiment, short)"),
    (lambda r: r["queueing"].update(enabled="yes"),
     "queueing.enabled: 'yes' is not allowed (expected true or false)"),
    (lambda r: r["queueing"].update(name_prefix="Team_"),
     "queueing.name_prefix: 'Team_' is not a name prefix (lower-case letters, digits, '-'; at most 40 characters"),
    (lambda r: r.pop("cluster"), "environment.toml: cluster: missing (required section)"),
    (lambda r: r["cluster"].pop("region"), "environment.toml: cluster.region: missing (required)"),
]


@pytest.mark.parametrize("mutate,message", BAD_SPECS, ids=[m for _, m in BAD_SPECS])
def test_bad_spec_is_refused_with_one_line(raw, mutate, message):
    broken = copy.deepcopy(raw)
    mutate(broken)
    with pytest.raises(SpecError) as err:
        environment_from_dict(broken, "environment.toml")
    text = str(err.value)
    assert "\n" not in text
    assert message in text, text


def test_missing_and_malformed_files_are_one_line(tmp_path):
    with pytest.raises(SpecError, match=r"^nope.toml: file not found$"):
        load_environment("nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\nname=1")
    with pytest.raises(SpecError, match=r"bad.toml: not valid TOML"):
        load_environment(bad)


def test_spec_imports_only_the_standard_library():
    """The spec must load where aws_cdk, cdk8s, ray and torch are absent (pure stdlib)."""
    code = (
        "import sys; before = set(sys.modules); import environment; from environment import load_environment;"
        f"load_environment({str(ROOT / 'environment.toml')!r}).world_size;"
        "new = {m.split('.')[0] for m in set(sys.modules) - before};"
        "third = sorted(m for m in new if m not in ('environment', 'spec_schema') and m not in sys.stdlib_module_names and not m.startswith('_'));"
        "print(','.join(third))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "", f"spec imported non-stdlib modules: {out.stdout}"


def test_summary_command_prints_the_environment(tmp_path):
    # unlocked explicitly: the pipeline's Synth runs these tests on a spec it has just locked
    spec = tmp_path / "environment.toml"
    spec.write_text(re.sub(r'(?m)^digest = "[^"]*"', 'digest = ""', (ROOT / "environment.toml").read_text()))
    out = subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "summary", "--env", str(spec)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "2 x g6.12xlarge" in out.stdout and "world size 8" in out.stdout
    assert "USD/hour" in out.stdout and "not locked to a digest" in out.stdout


def test_summary_refuses_bad_spec_with_one_line(tmp_path):
    bad = tmp_path / "env.toml"
    bad.write_text((ROOT / "environment.toml").read_text().replace('"g6.12xlarge"', '"g6.12xlarg"'))
    out = subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "summary", "--env", str(bad)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "gpu_node_groups[0].instance_type: 'g6.12xlarg'" in out.stderr


def test_a_spot_group_takes_types_of_one_gpu_shape_and_prices_as_an_estimate(raw):
    from environment.instances import SPOT_PRICE_FRACTION

    changed = copy.deepcopy(raw)
    changed["gpu_node_groups"][0].update(capacity="spot", instance_types=["g5.12xlarge"])
    env = environment_from_dict(changed)
    group = env.primary_gpu_group
    assert group.all_instance_types == ("g6.12xlarge", "g5.12xlarge") and group.spot
    price, label = env.node_price(group)
    assert price == pytest.approx(INSTANCE_TYPES["g6.12xlarge"].hourly_usd_estimate * SPOT_PRICE_FRACTION, abs=1e-4)
    assert "estimate" in label


@pytest.mark.parametrize(("fields", "message"), [
    ({"instance_types": ["g5.12xlarge"]},
     "gpu_node_groups[0].instance_types: ['g5.12xlarge'] is only for capacity = spot"),
    ({"capacity": "spot", "instance_types": ["g6.48xlarge"]},
     "gpu_node_groups[0].instance_types[0]: 'g6.48xlarge' has another GPU shape (8 GPUs x 24 GiB, 1 EFA) than "
     "instance_type g6.12xlarge (4 GPUs x 24 GiB, 1 EFA)"),
    ({"capacity": "spot", "instance_types": ["g6.12xlarge"]}, "is listed twice"),
    ({"capacity": "spot", "instance_types": ["g9.12xlarge"]}, "is not a known GPU instance type"),
    ({"capacity": "spot", "capacity_reservation_id": "cr-0123456789abcdef0"}, "must be empty for spot capacity"),
])
def test_spot_fields_refused_in_one_line(raw, fields, message):
    changed = copy.deepcopy(raw)
    changed["gpu_node_groups"][0].update(fields)
    with pytest.raises(SpecError) as err:
        environment_from_dict(changed)
    assert message in str(err.value) and "\n" not in str(err.value)
