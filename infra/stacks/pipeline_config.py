"""What the deployed pipeline stack bakes in from the spec and the code, as one fingerprint.

The pipeline deploys the storage and cluster stacks, never itself (a self-update mid-run would
restart the run). So after a commit that changes what the pipeline stack holds (the image tag
the watcher watches, the transport the smoke run must prove, the buildspecs, the history key),
the deployed pipeline would keep running the old configuration (the same for the watcher's retry
bound and maintenance window, the failure topic's subscriptions, Apply's build timeout). The stack passes
:func:`fingerprint` of the spec it was synthesized from to the Synth build (``PIPELINE_CONFIG``);
Synth recomputes it from the committed spec and refuses to run on a mismatch
(``raytrain_eks/pipeline/synth.py``), naming what to redeploy.
"""
from __future__ import annotations

import hashlib
import json

from environment import Environment
from infra.stacks import pipeline_builds

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
        "buildspecs": [pipeline_builds.synth_spec(), pipeline_builds.smoke_spec(env.bucket_name, transport),
                       pipeline_builds.apply_spec(env.bucket_name), pipeline_builds.promote_spec(transport)],
    }


def fingerprint(env: Environment) -> str:
    text = json.dumps(baked_in(env), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
