"""The redeploy pipeline's CodeBuild steps, as code the buildspecs run (``python -m raytrain_eks.pipeline``).

Each step is a function of (environment.toml, the synthesized ``dist/``, kubectl on PATH, AWS
through boto3) so the walk-through test runs the very same code against a local registry,
moto and a fake kubectl. Stage order and what each proves:

``check-run``      (Synth) not the run CodePipeline starts on creation, and the deployed pipeline
                   stack matches the commit (:mod:`.synth`).
``choose-digest``  (Synth) the ONE source of truth for what a run deploys: the promoted digest
                   in SSM, unless the run carries an explicit one (watcher, operator rollback)
                   or the committed one is new to the pipeline (:mod:`.synth`); records the
                   promoted digest it saw in ``dist/pipeline-run.json``.
``smoke``          the smoke RayJob on a RayCluster OF ITS OWN built from the new digest; the
                   image IDs its pods report become run.json's ``image_ran`` (:mod:`.smoke`).
``gate``           record checks + regression gate against the newest comparable promoted run
                   of another digest; the side-by-side report goes into the bucket (:mod:`.gate`).
``apply``          unless another execution promoted since Synth: the long-lived RayCluster
                   (``upgradeStrategy: Recreate``), waiting until it is ready with every pod
                   Ready on the new image ID (:mod:`.apply_promote`, :mod:`.kube`).
``promote``        compare-and-swap on the promoted digest Synth saw (:mod:`.apply_promote`).
Any failure in these steps is recorded in the promotion history with its reason; the
long-lived cluster goes back to the manifest the last promotion applied, if it differs from it
(:mod:`.rollback`, which also classes each failure: the image's or infrastructure).

What every step receives is defined here, once (:class:`StepContext`): the environment, the
synthesized manifests, kubectl, AWS clients, the promotion history; built from environment.toml
plus the build's environment variables (the same names the watcher Lambdas read).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from environment import Environment, load_environment
from infra.lambdas.image_watcher.history import PromotionHistory
from infra.lambdas.image_watcher.promote import VERSION_QUERY, read_record, split_record_uri

from .kube import Kubectl

PROMOTED_DIR = "promoted"
"""``dist/promoted/``: the manifests re-synthesized at the promoted digest (the rollback target
when the promotion has no ``applied`` history item)."""
RUN_FILE = "pipeline-run.json"
"""``dist/pipeline-run.json``, written by Synth's digest choice: ``digest`` (what this run
deploys) and ``promoted_at_synth`` (the promoted digest it saw, "" for none): Apply and Promote
compare-and-swap on it."""


def split_s3(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://`` URI (a ``?versionId=`` left out)."""
    bucket, key, _ = split_record_uri(uri)
    return bucket, key


def with_version(uri: str, version: str | None) -> str:
    """``uri`` pinned to one object version (unchanged without one: an unversioned bucket)."""
    return f"{uri}{VERSION_QUERY}{version}" if version and version != "null" else uri


@dataclass(kw_only=True)
class StepContext:
    env: Environment
    dist: Path
    kube: Kubectl
    s3: Any
    ssm: Any
    history: PromotionHistory
    parameter_name: str
    execution_id: str
    attempt: str = "1"
    """This build's attempt within the execution: CodeBuild's ``CODEBUILD_BUILD_NUMBER`` (per
    project, never reused), so a stage retried under the same execution id (CodePipeline's
    RetryStageExecution keeps it) gets a run name of its own."""
    sns: Any = None
    ecr: Any = None
    """ECR, where Promote tags the digest it promotes in the pull-through cache (None: a client is
    made when one is needed)."""
    topic_arn: str = ""
    """The pipeline's failure topic (``NOTIFY_TOPIC_ARN``; "" = notify nobody)."""
    max_attempts: int = 3
    poll_s: float = 30.0
    timeout_s: float = 3600.0
    queue_timeout_s: float = 14400.0
    """How long the smoke RayJob may wait in Kueue's queue (suspended) before Smoke gives up;
    its ``timeout_s`` counts from the admission."""
    rollback_timeout_s: float = 1800.0
    """A rollback's own wait, apart from the step's: the build's timeout covers both."""

    @classmethod
    def build(cls, env_file: str, dist: str, environ: Mapping[str, str] = os.environ) -> "StepContext":
        import boto3  # the build image's pip install; imported here so the logic stays importable

        env = load_environment(env_file)
        ddb = boto3.client("dynamodb")
        return cls(env=env, dist=Path(dist), kube=Kubectl(env.ray.namespace, environ.get("KUBECTL", "kubectl")),
                   s3=boto3.client("s3"), ssm=boto3.client("ssm"),
                   history=PromotionHistory(client=ddb, table_name=environ["HISTORY_TABLE"], image=image_key(env)),
                   parameter_name=environ["PROMOTED_DIGEST_PARAMETER"],
                   execution_id=environ.get("EXECUTION_ID", "manual"),
                   attempt=environ.get("CODEBUILD_BUILD_NUMBER", "1"),
                   sns=boto3.client("sns"), ecr=boto3.client("ecr"), topic_arn=environ.get("NOTIFY_TOPIC_ARN", ""),
                   max_attempts=env.pipeline.max_attempts,
                   poll_s=float(environ.get("POLL_SECONDS", 30)), timeout_s=float(environ.get("TIMEOUT_SECONDS", 3600)),
                   queue_timeout_s=float(environ.get("QUEUE_TIMEOUT_SECONDS", 14400)),
                   rollback_timeout_s=float(environ.get("ROLLBACK_TIMEOUT_SECONDS",
                                                        environ.get("TIMEOUT_SECONDS", 1800))))

    @property
    def repository(self) -> str:
        """The repository the pods pull from (the cache's with ``image.pull_through_cache``):
        what their ``imageID`` names, so what the readiness and smoke checks match."""
        from environment.image_source import pull_repository

        return pull_repository(self.env)

    def manifest(self, name: str, *, promoted: bool = False) -> dict[str, Any] | None:
        """A synthesized manifest as JSON (``None`` when absent, e.g. nothing promoted yet)."""
        import yaml

        path = self.dist / PROMOTED_DIR / name if promoted else self.dist / name
        return yaml.safe_load(path.read_text()) if path.is_file() else None

    def run_file(self) -> dict[str, str]:
        path = self.dist / RUN_FILE
        if not path.is_file():
            from .kube import KubeError

            raise KubeError(f"{path} is missing: was Synth run?")
        return json.loads(path.read_text())

    def apply_network_policies(self) -> None:
        """Server-side apply every Ray cluster's NetworkPolicy (``dist/network-policy.k8s.yaml``)
        before a cluster is created: the namespace denies ingress by default, so a cluster
        without its policy never comes up."""
        import yaml

        from charts.main import NETWORK_POLICY_CHART

        path = self.dist / f"{NETWORK_POLICY_CHART}.k8s.yaml"
        for policy in (d for d in yaml.safe_load_all(path.read_text()) if d):
            self.kube.apply(policy)

    def read_json(self, uri: str) -> dict[str, Any]:
        return read_record(self.s3, uri)

    def write_json(self, uri: str, data: dict[str, Any]) -> str:
        """Write; returns the object's new version id ("" in an unversioned bucket)."""
        bucket, key = split_s3(uri)
        reply = self.s3.put_object(Bucket=bucket, Key=key, ContentType="application/json",
                                   Body=(json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
        return reply.get("VersionId") or ""


def image_key(env: Environment) -> str:
    """The history table's partition key (the watcher's ``repository:tag``)."""
    return f"{env.image.repository}:{env.image.tag}"
