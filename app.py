"""The CDK entry point: read the spec ONCE (ENV_FILE, else context ``env``, else
environment.toml), build every stack from it, synthesize.

A spec error, including one only the infrastructure can see, prints ONE line and exits 2
before any output is written.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from environment import SpecError, load_environment


def _cli_context() -> dict:
    """The context the CDK CLI passes (``-c key=value``, in CDK_CONTEXT_JSON); {} without it."""
    try:
        context = json.loads(os.environ.get("CDK_CONTEXT_JSON") or "{}")
    except ValueError:
        return {}
    return context if isinstance(context, dict) else {}


def _named_spec() -> str:
    """The spec named without the CDK (ENV_FILE, or ``-c env=...`` as the CLI passes it in
    CDK_CONTEXT_JSON); "" when only a cdk.App can tell."""
    if os.environ.get("ENV_FILE"):
        return os.environ["ENV_FILE"]
    named = _cli_context().get("env", "")
    return named if isinstance(named, str) else ""


def _deploy_gate(env) -> tuple[str | None, frozenset[str], str | None]:
    """What the recorded `raytrain-eks verify` of this spec says (infra/verify_gate.py
    :func:`decide`): why the cluster stack may not be deployed yet, the GPU groups that already
    exist and the warning to print. The record's groups are trusted only while the cluster stack
    is the one it read them from: its state is read NOW (CloudFormation DescribeStacks, the
    credentials the CDK CLI deploys with), and only when a record would be trusted."""
    from pathlib import Path

    from infra import verify_gate

    path = verify_gate.stamp_path(Path(__file__).resolve().parent, env)
    recorded = path.read_text() if path.is_file() else None
    skip = str(_cli_context().get(verify_gate.SKIP_CONTEXT, "")).lower() == "true"

    def current_stack() -> str | None:
        from environment.contract import stack_name

        try:
            import boto3

            client = boto3.client("cloudformation", region_name=env.cluster.region)
            return verify_gate.stack_state(client, stack_name(env.cluster.name, "cluster"))
        except Exception as err:  # noqa: BLE001  (no credentials, no network: unknown, so refused)
            print(f"warning: {env.source}: could not read the cluster stack's state: {err}", file=sys.stderr)
            return None

    return verify_gate.decide(env, recorded, verify_gate.now(), os.environ.get("CDK_DEFAULT_ACCOUNT", ""), skip,
                              current_stack)


def main() -> int:
    named = _named_spec()
    if named:
        # Refuse a bad spec before aws_cdk (and its node process) is even imported: one line in
        # a fraction of a second, no JSII output.
        try:
            load_environment(named)
        except SpecError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    import aws_cdk as cdk

    from infra.build import build_app

    path = os.environ.get("ENV_FILE")
    if not path:
        # A throw-away App only to read the CLI's context (-c env=...): an App creates its
        # output directory, and nothing may be written before the spec is known to be good.
        with tempfile.TemporaryDirectory() as scratch:
            path = cdk.App(outdir=scratch).node.try_get_context("env")
    path = path or "environment.toml"
    try:
        env = load_environment(path)
        refusal, existing, warning = _deploy_gate(env)
        # refuses before creating the App (and its output dir)
        built = build_app(env, deploy_refusal=refusal, existing_gpu_groups=existing)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if warning:
        print(warning, file=sys.stderr)
    built.app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
