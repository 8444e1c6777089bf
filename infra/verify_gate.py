"""The deploy gate: ``cdk deploy`` of the cluster stack needs a passing ``raytrain-eks verify``
of the same spec and account, made recently.

A passing verify writes a stamp, :func:`stamp_path` (``.work/verify/<spec hash>.json``: the
account, the time and which GPU node groups exist, infra/existing_groups.py); app.py reads it and, without a fresh one, the cluster stack carries a
CloudFormation rule that always fails. ``cdk synth`` (and ``make demo``) is unaffected; a
deploy is refused when CloudFormation validates the template, before it changes anything, with
the rule's one line and its fix. ``-c raytrain:skip-verify=true`` is the explicit override.

Stdlib only (the CLI writes the stamp with these functions); app.py does the file reading.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from environment import Environment

MAX_AGE = timedelta(hours=24)
"""How long a passing verify counts: long enough for a deploy session, short enough that an
add-on pin EKS has since withdrawn or a quota since lowered is seen again."""
SKIP_CONTEXT = "raytrain:skip-verify"
"""The context key of the explicit override (``cdk deploy -c raytrain:skip-verify=true``)."""


def stamp_path(root: Path, env: Environment) -> Path:
    """Where a passing verify of ``env`` is recorded (one file per spec hash)."""
    return root / ".work" / "verify" / f"{env.spec_hash}.json"


def stamp(env: Environment, account: str, now: datetime, existing_gpu_groups: frozenset[str] = frozenset()) -> str:
    """The stamp's text for a verify of ``env`` that passed with credentials of ``account`` and
    found ``existing_gpu_groups`` deployed."""
    return json.dumps({"spec_hash": env.spec_hash, "account": account, "passed_at": now.isoformat(),
                       "existing_gpu_groups": sorted(existing_gpu_groups)})


def recorded_groups(recorded: str) -> frozenset[str] | None:
    """The GPU groups a stamp found deployed (None: a stamp that did not look)."""
    groups = json.loads(recorded).get("existing_gpu_groups")
    return None if groups is None else frozenset(groups)


def refusal(env: Environment, recorded: str | None, now: datetime, deploying_account: str = "") -> str | None:
    """Why the cluster stack may not be deployed (None: it may). ``recorded``: the stamp's
    text, if any; ``deploying_account``: the credentials' account when the CDK CLI knows it
    (CDK_DEFAULT_ACCOUNT), else the spec's."""
    fix = (f"run `raytrain-eks verify --env {env.source}` and deploy again "
           f"(or deploy with -c {SKIP_CONTEXT}=true to skip it)")
    if recorded is None:
        return f"{env.source}: no passing `raytrain-eks verify` of this spec (hash {env.spec_hash}): {fix}"
    record = json.loads(recorded)
    age = now - datetime.fromisoformat(record["passed_at"])
    if age > MAX_AGE:
        return (f"{env.source}: the last passing `raytrain-eks verify` of this spec is {age.total_seconds() / 3600:.0f} h "
                f"old (at most {MAX_AGE.total_seconds() / 3600:.0f} h): {fix}")
    account = deploying_account or env.cluster.account
    if account and record["account"] != account:
        return (f"{env.source}: `raytrain-eks verify` passed for account {record['account']}, this deploy is for "
                f"account {account}: {fix}")
    return None


def now() -> datetime:
    """The current time, in UTC (the stamp's zone)."""
    return datetime.now(timezone.utc)
