"""`raytrain-eks reproduce RUN_DIR [--against RUN_DIR_2]`: re-create a run's manifests from its
record and show they are byte-identical, or name each difference.

RUN_DIR is a run directory (local or s3://) holding run.json. The recorded commit is checked out
in a temporary git worktree when this checkout is elsewhere. With ``--against`` a second run of
the same job is compared too: same pins (seeds, data content, config) verify ``execution``,
bit-identical losses ``result``.

Exit codes: 0 byte-identical, 1 differences found, 2 the record cannot be re-synthesized.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN_DIR", help="run directory holding run.json (local or s3://)")
    parser.add_argument("--against", metavar="RUN_DIR_2", default=None,
                        help="a second run of the same job: verifies the execution and result levels")


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 90 else text[:87] + "..."


def run(args: argparse.Namespace) -> int:
    from raytrain_eks.reproduce import ReproduceError, compare_runs, reproduce

    try:
        outcome = reproduce(args.run)
    except (ReproduceError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"manifest     {outcome.manifest} re-synthesized from {outcome.tree}")
    for note in outcome.notes:
        print(f"note         {note}")
    if outcome.identical and outcome.applied_overrides:
        # the pipeline's smoke step applies the synthesized manifest with its run name appended
        print(f"identical    yes: byte-identical to the synthesized manifest ({outcome.new_hash}); what ran was "
              f"applied with {shlex.join(outcome.applied_overrides)} appended to its entrypoint (recorded in run.json)")
    elif outcome.identical:
        print(f"identical    yes: byte-identical to what ran ({outcome.new_hash})")
    else:
        print(f"identical    no: recorded {outcome.recorded_hash}, re-synthesized {outcome.new_hash}")
        for what, old, new in outcome.differences:
            print(f"  differs    {what}: recorded {_short(old)} -> now {_short(new)}")
    levels = ["infrastructure"] if outcome.verified == "infrastructure" else []
    pair: dict = {}
    if args.against:
        pair = compare_runs(args.run, args.against)
        if levels and pair["execution"]:
            levels.append("execution")
            if pair["result"]:
                levels.append("result")
        first = pair["first_loss_difference"]
        print(f"second run   same pins and config: {'yes' if pair['execution'] else 'no'}; losses "
              f"{'bit-identical' if pair['result'] else f'differ from step {first}' if first else 'not comparable'}"
              f" ({pair['steps'][0]} vs {pair['steps'][1]} steps)")
    held = ("result" if pair["result"] else "execution" if pair["execution"] else "") if args.against else ""
    why = ("" if levels else f" (the levels build on infrastructure, which is unverified; the pair alone shows "
                             f"{held})" if held else "")
    print(f"verified     {levels[-1] if levels else 'none'}{why}"
          f"{'' if args.against else ' (execution and result need a second run: --against RUN_DIR_2)'}")
    return 0 if outcome.identical else 1
