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
    """What the recorded `raytrain-eks verify` of this spec says (infra/verify_gate.py): why the
    cluster stack may not be deployed yet (None: it may; always None with
    ``-c raytrain:skip-verify=true``), the GPU groups that already exist (the same module;
    none without a recent pass: every group is written as a creation) and the warning to print
    when the override deploys without knowing them."""
    from pathlib import Path

    from infra import verify_gate

    path = verify_gate.stamp_path(Path(__file__).resolve().parent, env)
    recorded = path.read_text() if path.is_file() else None
    refusal = verify_gate.refusal(env, recorded, verify_gate.now(), os.environ.get("CDK_DEFAULT_ACCOUNT", ""))
    found = verify_gate.recorded_groups(recorded) if refusal is None else None
    skip = str(_cli_context().get(verify_gate.SKIP_CONTEXT, "")).lower() == "true"
    deploys = skip or refusal is None
    warning = verify_gate.reset_warning(env) if deploys and found is None else None
    return (None if skip else refusal), (found or frozenset()), warning


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
