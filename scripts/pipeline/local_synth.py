"""Run the Synth build's exact command list (infra/stacks/pipeline_builds.py SYNTH_COMMANDS) on
this machine, the way CodeBuild runs it: in a fresh copy of the tree (what the Source action's
``CODEBUILD_CLONE_REF`` full clone gives: the files of one commit plus ``.git``), on a spec
whose committed digest is locked, with moto's server for SSM, DynamoDB and CodePipeline.

    python scripts/pipeline/local_synth.py OUT_DIR [--no-git] [--keep-going]

``--no-git`` deletes ``.git`` first (CodePipeline's default zip artifact), to show what breaks
without it. The install phase is replaced by links to this checkout's ``.venv`` and
``node_modules``. Prints each command with its exit status; exits with the first non-zero one
(``--keep-going``: runs the rest too, as a diagnosis; CodeBuild stops at the first).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "5" * 64
ACCOUNT = "111122223333"
CONNECTION = f"arn:aws:codeconnections:us-east-1:{ACCOUNT}:connection/0f3c2b1a-4d5e-4f60-8a7b-9c0d1e2f3a4b"


def export_tree(out: Path) -> Path:
    """The tracked and untracked-but-not-ignored files, committed in a new repository."""
    tree = out / "tree"
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / name)
    spec = tree / "environment.toml"
    text = spec.read_text()
    for pattern, value in ((r'(?m)^account = ""', f'account = "{ACCOUNT}"'),
                           (r'(?m)^admin_principal_arns = \[\]', f'admin_principal_arns = ["arn:aws:iam::{ACCOUNT}:role/admin"]'),
                           (r'(?m)^connection_arn = ""', f'connection_arn = "{CONNECTION}"'),
                           (r'(?m)^repository = ""', 'repository = "example-org/raytrain-eks"'),
                           (r'(?m)^digest = "[^"]*"', f'digest = "{DIGEST}"')):  # an operator's lock, committed
        text, count = re.subn(pattern, value, text, count=1)
        assert count == 1, pattern
    spec.write_text(text)
    git = ["git", "-C", str(tree), "-c", "user.name=local", "-c", "user.email=local@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "export"], check=True)
    for link in (".venv", "node_modules"):
        (tree / link).symlink_to(ROOT / link)
    return tree


def aws_side(env) -> dict[str, str]:
    """moto's server with the parameter, table and pipeline the stack creates; one execution."""
    import boto3
    from moto.server import ThreadedMotoServer

    sys.path.insert(0, str(ROOT / "tests"))
    from oci_registry import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    kw = {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1",
          "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    name = env.cluster.name
    parameter, table, pipeline = f"/raytrain/{name}/image/promoted-digest", f"{name}-image-promotions", f"{name}-image-redeploy"
    boto3.client("ssm", **kw).put_parameter(Name=parameter, Value="none", Type="String")
    boto3.client("dynamodb", **kw).create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "image", "KeyType": "HASH"}, {"AttributeName": "at", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "image", "AttributeType": "S"}, {"AttributeName": "at", "AttributeType": "S"}])
    role = boto3.client("iam", **kw).create_role(RoleName="pipeline", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "codepipeline.amazonaws.com"}}]}))
    action = {"name": "a", "actionTypeId": {"category": "Source", "owner": "AWS", "provider": "S3", "version": "1"},
              "configuration": {"S3Bucket": "b", "S3ObjectKey": "k"}, "outputArtifacts": [{"name": "o"}]}
    cp = boto3.client("codepipeline", **kw)
    cp.create_pipeline(pipeline={"name": pipeline, "roleArn": role["Role"]["Arn"], "pipelineType": "V2",
                                 "artifactStore": {"type": "S3", "location": "artifacts"},
                                 "stages": [{"name": "Source", "actions": [action]},
                                            {"name": "Synth", "actions": [dict(action, name="b", outputArtifacts=[{"name": "p"}])]}]})
    execution = cp.start_pipeline_execution(name=pipeline)["pipelineExecutionId"]
    return {"AWS_ENDPOINT_URL": kw["endpoint_url"], "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "PIPELINE_NAME": pipeline,
            "EXECUTION_ID": execution, "PROMOTED_DIGEST_PARAMETER": parameter, "HISTORY_TABLE": table}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--no-git", action="store_true")
    parser.add_argument("--keep-going", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from environment import load_environment
    from infra.stacks.pipeline_builds import CONFIG_VARIABLE, SYNTH_COMMANDS, fingerprint, synth_spec

    if args.out.exists():
        shutil.rmtree(args.out)
    tree = export_tree(args.out)
    if args.no_git:
        shutil.rmtree(tree / ".git")
    env = load_environment(tree / "environment.toml")
    environ = {**os.environ, **aws_side(env), **synth_spec()["env"]["variables"],
               # what the stack sets on the Synth action
               "IMAGE_DIGEST": "spec", "ENV_FILE": "environment.toml", CONFIG_VARIABLE: fingerprint(env),
               "CLUSTER_NAME": env.cluster.name, "NAMESPACE": env.ray.namespace,
               "KUBERNETES_VERSION": env.cluster.kubernetes_version,
               "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    environ.pop("PYTHONPATH", None)
    print(f"tree: {tree} ({'no .git' if args.no_git else 'a fresh clone with .git'}), "
          f"committed digest {env.image.digest}")
    first_failure = 0
    for command in SYNTH_COMMANDS:
        start = time.monotonic()
        done = subprocess.run(["bash", "-c", command], cwd=tree, env=environ, capture_output=True, text=True)
        print(f"$ {command}\n  exit {done.returncode} ({time.monotonic() - start:.0f} s)", flush=True)
        if done.returncode:
            print((done.stdout + done.stderr)[-3000:], flush=True)
            first_failure = first_failure or done.returncode
            if not args.keep_going:
                return done.returncode
            continue
        print("  " + ((done.stderr.strip().splitlines() or [""])[-1])[:300], flush=True)
    if first_failure:
        return first_failure
    print(f"dist/pipeline-run.json: {(tree / 'dist' / 'pipeline-run.json').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
