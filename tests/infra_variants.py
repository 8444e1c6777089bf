"""The spec variants the infra tests synthesize, and the synthesizer (see conftest.py).

A module with a unique name, not conftest: several test folders have a conftest.py, and a bare
``from conftest import`` can pick up another folder's.

``default`` is the repository's spec template (tests/spec_template.py: account empty,
env-agnostic, whatever a deployment committed) with what the
CDK app requires the user to choose filled in: an admin principal and, without an account, an
explicit bucket name. ``alternative``
combines several changes in one synth: an account, 4 x g6.48xlarge on a capacity reservation, a
second GPU group of p5.48xlarge on a capacity block (32 EFA interfaces), a private endpoint,
an admin principal and no monitoring add-ons. ``existing`` installs onto an EKS cluster a
team already has (environment/existing.py): its system group and an L4 group exist, a p5 group
is added, KubeRay, the NVIDIA plugin and cluster-autoscaler are already there. ``pipeline`` is the
repository's environment.toml with the redeploy pipeline enabled (tests/infra/test_pipeline_stack.py
synthesizes it; devtools/synth_digest.py too).
"""
from __future__ import annotations

import copy
import json
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

from spec_template import template_raw

REPO = Path(__file__).resolve().parents[1]
ACCOUNT = "111122223333"
SUBMITTER = f"arn:aws:iam::{ACCOUNT}:role/ml-team"
TRACKING_SERVER = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:mlflow-tracking-server/team"
RESERVATION = "cr-0123456789abcdef0"
BLOCK = "cr-0fedcba9876543210"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/platform-admin"


DEFAULT_BUCKET = "raytrain-ci-checkpoints-example"


def default_raw() -> dict:
    raw = template_raw()
    raw["cluster"]["admin_principal_arns"] = [ADMIN]
    raw["storage"]["bucket_name"] = DEFAULT_BUCKET
    return raw


def capacity_raw() -> dict:
    """A capacity reservation made in a placement group, plus a SPOT p5.48xlarge group that
    scales from zero; the image through the account's ECR pull-through cache."""
    raw = copy.deepcopy(default_raw())
    raw["cluster"]["account"] = ACCOUNT
    raw["storage"]["bucket_name"] = ""
    raw["image"]["pull_through_cache"] = True
    raw["gpu_node_groups"][0].update(capacity="capacity-reservation", capacity_reservation_id=RESERVATION,
                                     placement_group="odcr-training-pg")
    raw["gpu_node_groups"].append(dict(name="p5", instance_type="p5.48xlarge", min_nodes=0, desired_nodes=0,
                                       max_nodes=2, root_volume_gib=500, capacity="spot"))
    return raw


def alternative_raw() -> dict:
    raw = copy.deepcopy(default_raw())
    raw["storage"]["bucket_name"] = ""
    raw["cluster"].update(account=ACCOUNT, endpoint_access="private", public_access_cidrs=[],
                          admin_principal_arns=[ADMIN])
    raw.setdefault("ray", {})["mlflow_tracking_server_arn"] = TRACKING_SERVER
    raw["cluster"]["submitter_principal_arns"] = [SUBMITTER]
    raw["gpu_node_groups"][0].update(
        instance_type="g6.48xlarge", min_nodes=4, desired_nodes=4, max_nodes=4,
        capacity="capacity-reservation", capacity_reservation_id=RESERVATION)
    raw["gpu_node_groups"].append(dict(
        name="h100", instance_type="p5.48xlarge", min_nodes=0, desired_nodes=0, max_nodes=2,
        root_volume_gib=500, capacity="capacity-block", capacity_reservation_id=BLOCK))
    raw["storage"]["noncurrent_version_days"] = 7
    raw["storage"]["prefix"] = "team/runs"
    raw["observability"] = {"enabled": False}
    return raw


EXISTING_CLUSTER = "team-gpu"
EXISTING_VPC = "vpc-0a1b2c3d4e5f60718"
EXISTING_SUBNETS = ["subnet-0aaaaaaaaaaaaaaa1", "subnet-0bbbbbbbbbbbbbbb2"]
EXISTING_SECURITY_GROUP = "sg-0123456789abcdef0"
EXISTING_SYSTEM_GROUP = "platform-system"
EXISTING_GPU_GROUP = "team-l4"
EXISTING_PRESENT = ["kuberay_operator", "nvidia_device_plugin", "cluster_autoscaler"]


PIPELINE_CONNECTION = f"arn:aws:codeconnections:us-east-1:{ACCOUNT}:connection/0f3c2b1a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
PIPELINE_DIGEST = "sha256:" + "5" * 64
PIPELINE_SCHEDULE = "rate(2 hours)"


def pipeline_raw() -> dict:
    """environment.toml with the pipeline on: a syntactically valid but fictitious connection ARN
    (test data only) and a private endpoint, the richer path (kubectl builds inside the VPC)."""
    from environment.model import MAX_APPLY_WAIT_MINUTES

    raw = tomllib.loads((REPO / "environment.toml").read_text())
    raw["cluster"].update(account=ACCOUNT, endpoint_access="private", public_access_cidrs=[],
                          admin_principal_arns=[f"arn:aws:iam::{ACCOUNT}:role/admin"])
    raw["image"]["digest"] = PIPELINE_DIGEST
    raw["pipeline"].update(connection_arn=PIPELINE_CONNECTION, repository="example-org/raytrain-eks",
                           branch="release", watch_schedule=PIPELINE_SCHEDULE, notify_emails=["oncall@example.com"],
                           maintenance_window="sat,sun 02:00-06:00", apply_wait_minutes=MAX_APPLY_WAIT_MINUTES)
    return raw


def existing_raw() -> dict:
    """An existing cluster: system and L4 groups it has, a p5 group added, three add-ons present."""
    raw = copy.deepcopy(default_raw())
    raw["storage"]["bucket_name"] = ""
    raw["cluster"].update(account=ACCOUNT, admin_principal_arns=[], existing=EXISTING_CLUSTER, vpc_id=EXISTING_VPC,
                          private_subnet_ids=list(EXISTING_SUBNETS), cluster_security_group_id=EXISTING_SECURITY_GROUP,
                          present_addons=list(EXISTING_PRESENT))
    raw["system_node_group"]["existing"] = EXISTING_SYSTEM_GROUP
    raw["gpu_node_groups"][0]["existing"] = EXISTING_GPU_GROUP
    raw["gpu_node_groups"].append(dict(name="p5", instance_type="p5.48xlarge", min_nodes=0, desired_nodes=0,
                                       max_nodes=2, root_volume_gib=500))
    return raw


@dataclass
class Synthesized:
    """One synthesized variant: the spec, the built app, its templates (dicts) and outdir."""

    env: object
    built: object
    outdir: Path

    def template(self, which: str):
        from aws_cdk.assertions import Template
        return Template.from_stack(getattr(self.built, which))

    def json(self, which: str) -> dict:
        stack = getattr(self.built, which)
        return json.loads((self.outdir / f"{stack.stack_name}.template.json").read_text())

    def resources(self, which: str, type_name: str) -> dict:
        return {k: v for k, v in self.json(which)["Resources"].items() if v["Type"] == type_name}

    @property
    def validation_report(self) -> dict:
        return json.loads((self.outdir / "validation-report.json").read_text())


def synthesize(raw: dict, outdir: Path, source: str) -> Synthesized:
    from infra.build import build_app, new_app
    from environment import environment_from_dict

    env = environment_from_dict(raw, source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unlocked-image warning is the spec's business
        built = build_app(env, new_app(env, outdir=str(outdir)))
        # Runs cdk-nag (a validation plugin): raises on any unacknowledged finding.
        built.app.synth()
    return Synthesized(env=env, built=built, outdir=outdir)
