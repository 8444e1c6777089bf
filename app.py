"""The CDK entry point: read the spec ONCE (ENV_FILE, else context ``env``, else
environment.toml), build every stack from it, synthesize.

A spec error, including one only the infrastructure can see, prints ONE line and exits 2
before any output is written.
"""
from __future__ import annotations

import os
import sys

from spec import SpecError, load_environment


def main() -> int:
    import aws_cdk as cdk

    from infra.build import build_app, new_app

    probe = cdk.App()  # only to read the CLI's context (-c env=...); never synthesized
    path = os.environ.get("ENV_FILE") or probe.node.try_get_context("env") or "environment.toml"
    try:
        env = load_environment(path)
        built = build_app(env, new_app(env))
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    built.app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
