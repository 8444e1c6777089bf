"""``python -m raytrain_eks.pipeline STEP``: what the pipeline's buildspecs run.

Results go to stdout (one line, for the buildspec to export), progress to stderr. Exit 1 when a
step fails (after rolling back), 2 for a bad invocation. Environment: ``PROMOTED_DIGEST_PARAMETER``,
``HISTORY_TABLE``, ``EXECUTION_ID`` (smoke run name), ``POLL_SECONDS``, ``TIMEOUT_SECONDS``.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_eks.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="environment.toml")
    parser.add_argument("--dist", default="dist")
    steps = parser.add_subparsers(dest="step", required=True)
    choose = steps.add_parser("choose-digest", help="print the digest this run deploys")
    choose.add_argument("--requested", default="spec", help="the run's IMAGE_DIGEST variable")
    steps.add_parser("promoted-digest", help="print the promoted digest ('' before the first promotion)")
    for name in ("smoke", "gate", "apply", "rollback"):
        step = steps.add_parser(name)
        step.add_argument("--digest", required=True, help="the candidate digest of this run")
        if name == "gate":
            step.add_argument("--record", required=True, help="s3:// URI of the smoke run's run.json")
            step.add_argument("--required-transport", default="any")
        if name == "rollback":
            step.add_argument("--reason", required=True)
    args = parser.parse_args(argv)

    from environment import SpecError

    from .context import StepContext

    try:
        ctx = StepContext.build(args.env, args.dist)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run(ctx, args)


def run(ctx, args: argparse.Namespace) -> int:
    from infra.lambdas.image_watcher.watcher import read_promoted

    from .digests import DigestError, choose
    from .gate import GateFailed, gate
    from .kube import KubeError, log, wait_for_image
    from .rollback import CLUSTER_FILE, rollback
    from .smoke import SmokeFailed, run_smoke

    if args.step == "promoted-digest":
        print(read_promoted(ctx.ssm, ctx.parameter_name))
        return 0
    if args.step == "choose-digest":
        committed, promoted = ctx.env.image.digest, read_promoted(ctx.ssm, ctx.parameter_name)
        try:
            choice = choose(requested=args.requested, committed=committed, promoted=promoted,
                            known_to_pipeline=bool(committed) and ctx.history.knows(committed))
        except DigestError as err:
            print(f"error: {args.env}: {err}", file=sys.stderr)
            return 2
        log(f"deploying {choice.digest}: {choice.reason}")
        print(choice.digest)
        return 0
    if args.step == "rollback":
        rollback(ctx, failed_digest=args.digest, reason=args.reason)
        return 0
    try:
        if args.step == "smoke":
            print(run_smoke(ctx, args.digest))
        elif args.step == "gate":
            gate(ctx, digest=args.digest, candidate_uri=args.record, required_transport=args.required_transport)
        else:
            cluster = ctx.manifest(CLUSTER_FILE)
            ctx.apply_network_policies()
            ctx.kube.apply(cluster)
            wait_for_image(ctx.kube, cluster, repository=ctx.repository, digest=args.digest,
                           timeout_s=ctx.timeout_s, poll_s=ctx.poll_s)
    except (SmokeFailed, GateFailed, KubeError) as err:
        log(f"error: {args.step}: {err}")
        rollback(ctx, failed_digest=args.digest, reason=f"{args.step}: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
