"""The CodeBuild steps of the redeploy pipeline: one buildspec per stage, as data. The logic
lives in ``scripts/pipeline/synth.sh`` and ``python -m raytrain_eks.pipeline`` (the code the
walk-through test runs); the buildspecs only install and call it.

File names are charts/main.py's: ``dist/raycluster.k8s.yaml`` (the long-lived cluster),
``dist/rayjob-smoke.k8s.yaml`` (the smoke job on a cluster of its own, from the new digest),
``dist/promoted/`` (the same at the promoted digest: the rollback target when the promotion
predates the ``applied`` history items), ``dist/pipeline-run.json`` (the digest this run deploys
and the promoted digest its Synth saw: the compare-and-swap of Apply and Promote) and
``dist/code/training-<hash>.zip`` (uploaded to ``s3://<bucket>/code/``).

The builds' configuration is also what the deployed pipeline stack bakes in from the spec and
the code, as one fingerprint (:func:`fingerprint`). The pipeline deploys the storage and cluster
stacks, never itself (a self-update mid-run would restart the run). So after a commit that
changes what the pipeline stack holds (the image tag the watcher watches, the transport the smoke
run must prove, the buildspecs, the history key), the deployed pipeline would keep running the
old configuration (the same for the watcher's retry bound and maintenance window, the failure
topic's subscriptions, Apply's build timeout). The stack passes :func:`fingerprint` of the spec
it was synthesized from to the Synth build (``PIPELINE_CONFIG``); Synth recomputes it from the
committed spec and refuses to run on a mismatch (``raytrain_eks/pipeline/synth.py``),
naming what to redeploy.
"""
from __future__ import annotations

import hashlib
import json

from aws_cdk import Duration, aws_codebuild as codebuild, aws_iam as iam
from constructs import Construct

from environment import Environment

SMOKE_TIMEOUT_MINUTES = 60
"""The smoke run's wait, from Kueue's admission (raytrain_eks/pipeline/smoke.py)."""
SMOKE_QUEUE_MINUTES = 240
"""How long the smoke RayJob may wait in Kueue's queue for the GPU jobs already admitted (it is
``short``: ahead of every queued experiment) before Smoke gives up and the watcher retries."""
APPLY_TIMEOUT_MINUTES = 30
PROMOTE_TIMEOUT_MINUTES = 5
"""Promote waits for nothing itself (reads, one transaction, one write); a rollback has its own
budget, APPLY_TIMEOUT_MINUTES (ROLLBACK_TIMEOUT_SECONDS)."""
BUILD_IMAGE = codebuild.LinuxBuildImage.STANDARD_7_0
NODE_RUNTIME = "22"
"""Node.js 22 (maintenance LTS; 20 reached its end of life in April 2026), a runtime of the
Ubuntu standard:7.0 image (CodeBuild "Available runtimes")."""
PIP = "pip install --quiet --disable-pip-version-check -c requirements.lock"
SYNTH_TESTS = ("tests/environment tests/infra tests/charts tests/raytrain_eks/pipeline tests/raytrain_eks/verify/test_lock.py "
               "tests/raytrain_eks/planning/test_fit.py tests/raytrain_eks/verify/test_capacity_command.py tests/test_drift.py")
"""What Synth tests: the environment package, infra (with the image watcher Lambda), charts, the
pipeline's steps, ``lock``, the fit check and the capacity report (not the training loop: that
needs torch and Ray, which the image ships and Synth never installs)."""
KUBECTL_INSTALL = (
    # The newest patch of the cluster's minor version (kubectl supports one minor of skew),
    # checked against the sha256 the Kubernetes release publishes beside it (kubernetes.io,
    # "Install and Set Up kubectl on Linux": validate the binary against kubectl.sha256) before
    # it runs with the build's deploy rights.
    'KUBECTL_URL="https://dl.k8s.io/release/$(curl -fsSL https://dl.k8s.io/release/stable-${KUBERNETES_VERSION}.txt)'
    '/bin/linux/amd64/kubectl"'
    ' && curl -fsSLo /usr/local/bin/kubectl "$KUBECTL_URL"'
    ' && echo "$(curl -fsSL "$KUBECTL_URL.sha256")  /usr/local/bin/kubectl" | sha256sum --check --strict'
    " && chmod +x /usr/local/bin/kubectl",
    'aws eks update-kubeconfig --name "$CLUSTER_NAME" --region "$AWS_REGION"',
)


def project(scope: Construct, construct_id: str, spec: dict, *, role: iam.IRole | None = None,
            compute: codebuild.ComputeType = codebuild.ComputeType.SMALL,
            timeout: Duration = Duration.minutes(60), **kwargs) -> codebuild.PipelineProject:
    return codebuild.PipelineProject(
        scope, construct_id, build_spec=codebuild.BuildSpec.from_object(spec), role=role,
        environment=codebuild.BuildEnvironment(build_image=BUILD_IMAGE, compute_type=compute),
        timeout=timeout, **kwargs)


SYNTH_COMMANDS = [
    ".venv/bin/python -m raytrain_eks.pipeline check-run",
    f".venv/bin/python -m pytest -q -m 'not slow' {SYNTH_TESTS}",
    'IMAGE_DIGEST="$(PYTHON=.venv/bin/python bash scripts/pipeline/synth.sh)"',
    # The pipeline redeploys what a verified first deploy created; its gate is its own checks
    # (check-run, the tests, the smoke run), not a `raytrain-eks verify` stamp (infra/verify_gate.py).
    'PATH="$PWD/.venv/bin:$PATH" node_modules/.bin/cdk synth --quiet -c raytrain:skip-verify=true',
]
"""The Synth build's commands, in order (the walk-through runs exactly these)."""


def synth_spec() -> dict:
    """Refuse the pipeline's creation run and a stale pipeline stack (``check-run``), test the
    committed tree, choose and pin the digest (the promoted one unless this run carries one),
    synthesize; exports the digest deployed. Installs the ``synth`` extra only: no torch, no Ray.

    The source is a full clone (``CODEBUILD_CLONE_REF``): the manifests' identity is the commit,
    which only ``.git`` knows. The tests run BEFORE the digest is pinned, on what was committed."""
    return {
        "version": "0.2",
        "env": {"shell": "bash", "exported-variables": ["IMAGE_DIGEST"],
                "variables": {"CDK_DISABLE_CLI_TELEMETRY": "true"}},
        "phases": {
            "install": {"runtime-versions": {"python": "3.11", "nodejs": NODE_RUNTIME}, "commands": [
                "bash scripts/install-system-deps.sh",  # the real registry the pipeline tests use
                "python -m venv .venv",
                f".venv/bin/{PIP} -e '.[synth]'",
                "npm ci --no-audit --no-fund --loglevel=error",
            ]},
            "build": {"commands": SYNTH_COMMANDS},
        },
        "artifacts": {"files": ["**/*"],
                      "exclude-paths": [".venv/**/*", "node_modules/**/*", ".git/**/*"]},
    }


HOLD_VARIABLE = "HOLD_PASSED_AT"
"""HoldDeploy's exported variable: when its hold passed (epoch seconds); DeployStacks' environment."""

DEPLOY_COMMANDS = [
    # A "Retry failed actions" reruns Deploy alone, on a hold that passed maybe hours ago: refuse
    # a pass older than the bound, naming "Retry stage" (raytrain_eks/pipeline/apply_promote.py
    # check_hold_fresh). First: before anything reads or writes AWS.
    f'.venv/bin/python -m raytrain_eks.pipeline check-hold --passed-at "${HOLD_VARIABLE}"',
    # Which GPU groups exist, recorded where app.py reads it: an existing autoscaled group is
    # deployed without DesiredSize, so the update leaves its running nodes alone.
    ".venv/bin/python -m raytrain_eks.pipeline record-groups",
    # Re-synthesized from the Synth output tree (its pinned spec) with that record.
    'PATH="$PWD/.venv/bin:$PATH" node_modules/.bin/cdk deploy --require-approval never --progress events '
    "-c raytrain:skip-verify=true",
]
"""The Deploy build's commands, in order; the stack names follow the last."""


def deploy_spec(stack_names: list[str]) -> dict:
    """Refuse a stale HoldDeploy pass, record the existing GPU node groups, then ``cdk deploy``
    the named stacks (and their dependencies), synthesized again with that record
    (raytrain_eks/verify/account.py record_node_groups)."""
    *record, deploy = DEPLOY_COMMANDS
    return {
        "version": "0.2",
        "env": {"shell": "bash", "variables": {"CDK_DISABLE_CLI_TELEMETRY": "true"}},
        "phases": {
            "install": {"runtime-versions": {"python": "3.11", "nodejs": NODE_RUNTIME}, "commands": [
                "python -m venv .venv",
                f".venv/bin/{PIP} -e '.[infra]'",
                "npm ci --no-audit --no-fund --loglevel=error",
            ]},
            "build": {"commands": [*record, f"{deploy} {' '.join(stack_names)}"]},
        },
    }


def _kubectl_install() -> list[str]:
    return [*KUBECTL_INSTALL, f"{PIP} -e '.[pipeline]'"]


def hold_spec(cluster_stack: str) -> dict:
    """Before Deploy: when the cluster stack's update (Synth's template, ``cdk.out``, against the
    deployed one) rolls, replaces or deletes a GPU node group, wait for the running GPU jobs and
    the maintenance window exactly as Apply does (``python -m raytrain_eks.pipeline hold``);
    a deferral fails the action, so nothing is deployed and the jobs run on. A pass exports when
    it passed (:data:`HOLD_VARIABLE`), which DeployStacks checks first."""
    return {
        "version": "0.2",
        "env": {"shell": "bash", "exported-variables": [HOLD_VARIABLE]},
        "phases": {
            "install": {"runtime-versions": {"python": "3.11"}, "commands": _kubectl_install()},
            "build": {"commands": [f'{HOLD_VARIABLE}="$(python -m raytrain_eks.pipeline hold '
                                   f'--template cdk.out/{cluster_stack}.template.json)"']},
        },
    }


def upload_code(bucket: str) -> str:
    """The content-addressed code archive every RayJob's working_dir names (idempotent)."""
    return (f'aws s3 cp --only-show-errors dist/code/ "s3://{bucket}/code/" --recursive '
            '--exclude "*" --include "training-*.zip"')


def apply_spec(bucket: str) -> dict:
    """Upload the code archive (the ``*-on-cluster`` jobs need it), apply the long-lived
    RayCluster (``upgradeStrategy: Recreate``) unless another execution promoted since Synth,
    and wait until it is ready with every pod Ready on the new image; on failure, roll back."""
    return {
        "version": "0.2",
        "env": {"shell": "bash"},
        "phases": {
            "install": {"runtime-versions": {"python": "3.11"}, "commands": _kubectl_install()},
            "build": {"commands": [
                upload_code(bucket),
                'python -m raytrain_eks.pipeline apply --digest "$IMAGE_DIGEST"',
            ]},
        },
    }


def smoke_spec(bucket: str, required_transport: str) -> dict:
    """Upload the code archive the smoke job runs, run the smoke RayJob on its own cluster from
    the new digest, then the record and regression gate; exports where its record is. On
    failure: roll back, fail the stage."""
    return {
        "version": "0.2",
        "env": {"shell": "bash", "exported-variables": ["SMOKE_RECORD"]},
        "phases": {
            "install": {"runtime-versions": {"python": "3.11"}, "commands": _kubectl_install()},
            "build": {"commands": [
                upload_code(bucket),
                'SMOKE_RECORD="$(python -m raytrain_eks.pipeline smoke --digest "$IMAGE_DIGEST")"',
                'python -m raytrain_eks.pipeline gate --digest "$IMAGE_DIGEST" --record "$SMOKE_RECORD" '
                f"--required-transport {required_transport}",
            ]},
        },
    }


def promote_spec(required_transport: str) -> dict:
    """The compare-and-swap promotion (raytrain_eks/pipeline/apply_promote.py); on failure the
    long-lived cluster goes back to the promoted manifest in the same build, and the history
    says why."""
    return {
        "version": "0.2",
        "env": {"shell": "bash"},
        "phases": {
            "install": {"runtime-versions": {"python": "3.11"}, "commands": _kubectl_install()},
            "build": {"commands": [
                'python -m raytrain_eks.pipeline promote --digest "$IMAGE_DIGEST" --record "$SMOKE_RECORD" '
                f"--required-transport {required_transport}",
            ]},
        },
    }


# --- What the deployed stack bakes in (the module docstring says why) --------------------------

CONFIG_VARIABLE = "PIPELINE_CONFIG"
"""The Synth action's environment variable holding the deployed fingerprint."""


def required_transport(env: Environment) -> str:
    """What the smoke run must prove: EFA between nodes when the group has EFA and several nodes."""
    group = env.primary_gpu_group
    return "efa" if group.efa_per_node and group.job_nodes > 1 else "any"


def kubectl_in_vpc(env: Environment) -> bool:
    """The kubectl builds join the VPC whenever the private endpoint is on: with
    ``public_and_private`` the public endpoint admits only ``public_access_cidrs``, which
    CodeBuild's public addresses are not in."""
    return env.cluster.endpoint_access != "public"


def baked_in(env: Environment) -> dict:
    """Every value of the pipeline stack that comes from the spec or the code (not names the
    account assigns)."""
    transport = required_transport(env)
    return {
        "image": f"{env.image.repository}:{env.image.tag}",
        "required_transport": transport,
        "watch_schedule": env.pipeline.watch_schedule,
        "source": [env.pipeline.connection_arn, env.pipeline.repository, env.pipeline.branch],
        "kubectl_in_vpc": kubectl_in_vpc(env),
        # the watcher's environment, the failure topic's subscriptions, Apply's build timeout
        "retries": [env.pipeline.max_attempts, env.pipeline.maintenance_window, env.pipeline.apply_wait_minutes],
        "notify_emails": list(env.pipeline.notify_emails),
        "buildspecs": [synth_spec(), smoke_spec(env.bucket_name, transport),
                       apply_spec(env.bucket_name), promote_spec(transport)],
    }


def fingerprint(env: Environment) -> str:
    text = json.dumps(baked_in(env), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
