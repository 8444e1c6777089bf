"""The CodeBuild steps of the redeploy pipeline: one buildspec per stage, as data.

File names are charts/main.py's: ``dist/raycluster.k8s.yaml`` (applied on every deploy),
``dist/rayjob-<job>-on-cluster.k8s.yaml`` (the smoke job on that RayCluster, so it runs the image
just applied) and ``dist/code/training-<hash>.zip`` (uploaded to ``s3://<bucket>/code/``).
"""
from __future__ import annotations

from aws_cdk import Duration, aws_codebuild as codebuild, aws_iam as iam
from constructs import Construct

from environment.contract import IMAGE_DIGEST_ANNOTATION as DIGEST_ANNOTATION
from environment import Environment

SMOKE_JOB = "smoke"
"""jobs/smoke.toml's ``name``: the RayJob the pipeline runs before promoting."""
SMOKE_TIMEOUT_MINUTES = 60
BUILD_IMAGE = codebuild.LinuxBuildImage.STANDARD_7_0
FIELD_MANAGER = "raytrain-pipeline"
KUBECTL_INSTALL = (
    # The newest patch of the cluster's minor version (kubectl supports one minor of skew).
    'curl -fsSLo /usr/local/bin/kubectl "https://dl.k8s.io/release/'
    '$(curl -fsSL https://dl.k8s.io/release/stable-${KUBERNETES_VERSION}.txt)/bin/linux/amd64/kubectl"'
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


def synth_spec() -> dict:
    """Lock (when the run carries a digest), test, synthesize; exports the digest deployed."""
    return {
        "version": "0.2",
        "env": {"shell": "bash", "exported-variables": ["IMAGE_DIGEST"]},
        "phases": {
            "install": {"runtime-versions": {"python": "3.11", "nodejs": "20"},
                        "commands": ["make install"]},
            "build": {"commands": [
                # The documented rollback path, the same command an operator runs by hand.
                'if [ "$IMAGE_DIGEST" != "spec" ]; then '
                '.venv/bin/raytrain-eks lock --env "$ENV_FILE" --digest "$IMAGE_DIGEST"; fi',
                'IMAGE_DIGEST="$(.venv/bin/python -c \'import sys; from environment import load_environment; '
                'print(load_environment(sys.argv[1]).image.digest)\' "$ENV_FILE")"',
                'test -n "$IMAGE_DIGEST" || { echo "error: $ENV_FILE: image.digest is empty: run '
                'raytrain-eks lock and commit, or start the pipeline with IMAGE_DIGEST"; exit 1; }',
                "make test",
                'make synth ENV_FILE="$ENV_FILE"',
            ]},
        },
        "artifacts": {"files": ["**/*"],
                      "exclude-paths": [".venv/**/*", "node_modules/**/*", ".git/**/*"]},
    }


def deploy_spec(stack_names: list[str]) -> dict:
    """``cdk deploy`` of the named stacks (and their dependencies) from the built assembly."""
    return {
        "version": "0.2",
        "env": {"shell": "bash", "variables": {"CDK_DISABLE_CLI_TELEMETRY": "true"}},
        "phases": {
            "install": {"runtime-versions": {"nodejs": "20"},
                        "commands": ["npm ci --no-audit --no-fund --loglevel=error"]},
            "build": {"commands": [
                "node_modules/.bin/cdk deploy --app cdk.out --require-approval never --progress events "
                + " ".join(stack_names)]},
        },
    }


def apply_spec(bucket: str) -> dict:
    """Upload the code archive, then server-side apply the RayCluster (the CRDs are too large
    for client-side apply, kuberay issue 410)."""
    return {
        "version": "0.2",
        "env": {"shell": "bash"},
        "phases": {
            "install": {"commands": list(KUBECTL_INSTALL)},
            "build": {"commands": [
                f'aws s3 cp --only-show-errors dist/code/ "s3://{bucket}/code/" --recursive '
                '--exclude "*" --include "training-*.zip"',
                f"kubectl apply --server-side --field-manager={FIELD_MANAGER} --force-conflicts "
                "-f dist/raycluster.k8s.yaml",
            ]},
        },
    }


def smoke_spec(env: Environment) -> dict:
    """Run the smoke RayJob under a run name unique to this execution (a reused name would
    resume the previous, finished run), wait for its end, export where its record is."""
    job = f"{SMOKE_JOB}-on-cluster"
    run = f"{SMOKE_JOB}-$EXECUTION_ID"
    polls = SMOKE_TIMEOUT_MINUTES * 2
    return {
        "version": "0.2",
        "env": {"shell": "bash", "exported-variables": ["SMOKE_RECORD"]},
        "phases": {
            "install": {"commands": list(KUBECTL_INSTALL)},
            "build": {"commands": [
                # The manifests of this run carry the digest being proven (provenance annotation).
                f'for f in dist/raycluster.k8s.yaml dist/rayjob-{job}.k8s.yaml; do '
                f'grep -q "{DIGEST_ANNOTATION}: $IMAGE_DIGEST" "$f" || '
                '{ echo "error: $f was not synthesized with $IMAGE_DIGEST"; exit 1; }; done',
                f'kubectl -n "$NAMESPACE" delete rayjob {job} --ignore-not-found --wait=true',
                f"kubectl create --dry-run=client -o json -f dist/rayjob-{job}.k8s.yaml "
                f'| jq --arg run "{run}" \'.spec.entrypoint += " --set checkpoint.run_name=" + $run\' '
                f"| kubectl apply --server-side --field-manager={FIELD_MANAGER} -f -",
                # jobStatus: SUCCEEDED / FAILED / STOPPED are final (KubeRay v1.7.0 RayJob).
                f'for i in $(seq {polls}); do '
                f'status="$(kubectl -n "$NAMESPACE" get rayjob {job} -o jsonpath=\'{{.status.jobStatus}}\')"; '
                'echo "smoke: ${status:-PENDING}"; '
                'case "$status" in SUCCEEDED) break;; FAILED|STOPPED) '
                f'kubectl -n "$NAMESPACE" describe rayjob {job} | tail -n 30; exit 1;; esac; '
                f'sleep 30; done; test "$status" = SUCCEEDED',
                f'SMOKE_RECORD="{env.storage_uri}/{run}/run.json"',
                'aws s3 cp --only-show-errors "$SMOKE_RECORD" smoke-run.json',
                "jq '{status, image, transport: .transport.transport}' smoke-run.json",
            ]},
        },
    }
