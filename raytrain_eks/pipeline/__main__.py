"""``python -m raytrain_eks.pipeline STEP``: what the pipeline's buildspecs run.

Results go to stdout (one line, for the buildspec to export), progress to stderr. Exit 1 when a
step fails (after rolling back), 2 for a bad invocation. Environment: ``PROMOTED_DIGEST_PARAMETER``,
``HISTORY_TABLE``, ``EXECUTION_ID`` and ``CODEBUILD_BUILD_NUMBER`` (the smoke run name),
``NOTIFY_TOPIC_ARN`` (failures), ``POLL_SECONDS``, ``TIMEOUT_SECONDS``, ``QUEUE_TIMEOUT_SECONDS`` (Smoke's
wait in Kueue's queue);
``check-run`` also ``PIPELINE_NAME`` and ``PIPELINE_CONFIG``. ``hold`` prints when it passed,
which ``check-hold`` (Deploy's first command) judges.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_eks.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="environment.toml")
    parser.add_argument("--dist", default="dist")
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("check-run", help="refuse the creation run and a stale pipeline stack")
    choose = steps.add_parser("choose-digest", help="print the digest this run deploys")
    choose.add_argument("--requested", default="spec", help="the run's IMAGE_DIGEST variable")
    choose.add_argument("--run-file", default="", help="also write the choice and the promoted digest seen here")
    steps.add_parser("promoted-digest", help="print the promoted digest ('' before the first promotion)")
    steps.add_parser("record-groups", help="record which GPU node groups exist (read by app.py at cdk deploy)")
    hold = steps.add_parser("hold", help="before cdk deploy: wait for running GPU jobs and the window when the "
                                         "cluster stack's update rolls, replaces or deletes a GPU node group")
    hold.add_argument("--template", required=True, help="the cluster stack's template about to be deployed")
    fresh = steps.add_parser("check-hold", help="DeployStacks' first command: refuse a HoldDeploy pass older than "
                                                "the bound (a 'Retry failed actions' does not rerun the hold)")
    fresh.add_argument("--passed-at", required=True, help="HoldDeploy's exported HOLD_PASSED_AT (epoch seconds)")
    for name in ("smoke", "gate", "apply", "promote", "rollback"):
        step = steps.add_parser(name)
        step.add_argument("--digest", required=True, help="the candidate digest of this run")
        if name in ("gate", "promote"):
            step.add_argument("--record", required=True, help="s3:// URI of the smoke run's run.json")
            step.add_argument("--required-transport", default="any")
        if name == "rollback":
            step.add_argument("--reason", required=True)
            step.add_argument("--failure", default="image", choices=("image", "infrastructure", "deferred"),
                              help="image (default) shelves the digest; the others let the watcher retry it")
    args = parser.parse_args(argv)

    from environment import SpecError

    if args.step == "check-run":
        return check_run(args)
    if args.step == "record-groups":
        return record_groups(args)
    if args.step == "check-hold":
        return check_hold(args)
    from . import StepContext

    try:
        ctx = StepContext.build(args.env, args.dist)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run(ctx, args)


def check_run(args: argparse.Namespace, environ=os.environ) -> int:
    import boto3

    from environment import SpecError, load_environment
    from infra.stacks.pipeline_builds import CONFIG_VARIABLE, fingerprint

    from .synth import RunRefused, check_run as check

    try:
        env = load_environment(args.env)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        trigger = check(codepipeline=boto3.client("codepipeline"), pipeline_name=environ["PIPELINE_NAME"],
                        execution_id=environ["EXECUTION_ID"], deployed=environ.get(CONFIG_VARIABLE, ""),
                        committed=fingerprint(env), stack_hint=f"cdk deploy {env.cluster.name}-pipeline")
    except RunRefused as err:
        print(f"error: check-run: {err}", file=sys.stderr)
        return 1
    print(f"check-run: {trigger or 'unknown'} trigger; pipeline configuration matches the commit", file=sys.stderr)
    return 0


def check_hold(args: argparse.Namespace) -> int:
    import time

    from .apply_promote import HoldExpired, check_hold_fresh

    try:
        print(f"check-hold: {check_hold_fresh(args.passed_at, time.time())}", file=sys.stderr)
    except HoldExpired as err:
        print(f"error: check-hold: nothing deployed: {err}", file=sys.stderr)
        return 1
    return 0


def record_groups(args: argparse.Namespace) -> int:
    import boto3

    from environment import SpecError, load_environment
    from raytrain_eks.verify.account import record_node_groups

    try:
        env = load_environment(args.env)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    region = env.cluster.region
    account = boto3.client("sts", region_name=region).get_caller_identity()["Account"]
    found = record_node_groups(env, Path.cwd(), boto3.client("eks", region_name=region), account,
                               boto3.client("cloudformation", region_name=region))
    print(f"record-groups: existing GPU node groups: {', '.join(sorted(found)) or 'none'}", file=sys.stderr)
    return 0


def run(ctx, args: argparse.Namespace) -> int:
    from infra.lambdas.image_watcher.promote import promoted_digest

    from .kube import log
    from .rollback import classify, rollback
    from .synth import DigestError, choose

    if args.step == "promoted-digest":
        print(promoted_digest(ctx.ssm, ctx.parameter_name, ctx.history))
        return 0
    if args.step == "choose-digest":
        committed, promoted = ctx.env.image.digest, promoted_digest(ctx.ssm, ctx.parameter_name, ctx.history)
        try:
            choice = choose(requested=args.requested, committed=committed, promoted=promoted,
                            known_to_pipeline=bool(committed) and ctx.history.knows(committed))
        except DigestError as err:
            print(f"error: {args.env}: {err}", file=sys.stderr)
            return 2
        log(f"deploying {choice.digest}: {choice.reason}")
        if args.run_file:
            Path(args.run_file).write_text(json.dumps({"digest": choice.digest, "promoted_at_synth": promoted}) + "\n")
        print(choice.digest)
        return 0
    if args.step == "rollback":
        rollback(ctx, failed_digest=args.digest, reason=args.reason, failure=args.failure)
        return 0
    if args.step == "hold":
        return hold_step(ctx, args)
    try:
        print(step(ctx, args) or "")
    except Exception as err:  # noqa: BLE001 - every failure is rolled back and recorded, then fails the build
        log(f"error: {args.step}: {type(err).__name__}: {err}")
        try:
            rollback(ctx, failed_digest=args.digest, reason=f"{args.step}: {err}", failure=classify(err))
        except Exception as again:  # noqa: BLE001 - the build fails either way; say both
            log(f"error: rollback after {args.step} failed too: {type(again).__name__}: {again}")
        return 1
    return 0


def hold_step(ctx, args: argparse.Namespace) -> int:
    """Exit 1 (nothing deployed, the jobs run on) when the deploy would roll, replace or delete a
    GPU node group under running jobs past the bound or outside the window; 0 to deploy, printing
    when it passed (epoch seconds, the action's HOLD_PASSED_AT). The deployed template is the cluster stack's own (CloudFormation GetTemplate; none: a creation)."""
    import time

    import boto3

    from environment.contract import stack_name

    from .apply_promote import Deferred, hold_deploy
    from .kube import log

    cloudformation = boto3.client("cloudformation", region_name=ctx.env.cluster.region)
    try:
        try:
            body = cloudformation.get_template(StackName=stack_name(ctx.env.cluster.name, "cluster"))["TemplateBody"]
        except cloudformation.exceptions.ClientError as err:
            if "does not exist" not in str(err):
                raise
            body = {}  # no cluster stack yet: the deploy creates every group, disturbing nothing
        deployed = json.loads(body) if isinstance(body, str) else body
        log(f"hold: {hold_deploy(ctx, deployed, json.loads(Path(args.template).read_text()))}")
        # When it passed, for DeployStacks (exported HOLD_PASSED_AT): a Deploy retried alone
        # later must not deploy on this verdict (apply_promote.check_hold_fresh).
        print(f"{time.time():.0f}")
    except Deferred as err:
        log(f"error: hold: deferred, nothing deployed: {err}")
        return 1
    except Exception as err:  # noqa: BLE001 - unknown is no licence to deploy: the action fails, nothing deployed
        log(f"error: hold: {type(err).__name__}: {err}")
        return 1
    return 0


def step(ctx, args: argparse.Namespace) -> str:
    if args.step == "smoke":
        from .smoke import run_smoke

        return run_smoke(ctx, args.digest)
    if args.step == "gate":
        from .gate import gate

        gate(ctx, digest=args.digest, candidate_uri=args.record, required_transport=args.required_transport)
        return ""
    if args.step == "apply":
        from .apply_promote import apply

        apply(ctx, args.digest)
        return ""
    from .apply_promote import promote_step

    promote_step(ctx, digest=args.digest, record_uri=args.record, required_transport=args.required_transport)
    return ""


if __name__ == "__main__":
    sys.exit(main())
