"""`raytrain-eks stop RUN`: stop a run.

A local run (``submit --local``) is stopped through its own Ray head
(``JobSubmissionClient.stop_job``); its submit then copies what the run wrote and stops the head
and the storage. On EKS, the run's RayJob is deleted: KubeRay v1.7.0 stops the Ray job first
when it is not finished (``rayjob_controller.go``: the RayJobStopJobFinalizer calls the
dashboard's StopJob), also on the long-lived RayCluster, which stays; a run's own cluster (owned
by its RayJob, rayjob_controller.go:1021) goes after it (background deletion, so the
finalizer's StopJob runs before the collector deletes the cluster). The run's storage (checkpoints, run.json) stays: ``submit --resume RUN``
continues it.

Exit codes: 0 stopped, 2 no such run (or a local run that has already ended), 5 the cluster
could not be reached."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from raytrain_eks.eks_backend import add_run_arguments

    add_run_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from raytrain_eks import local_runs

    local = local_runs.find(args.run)
    if local is not None:
        if not local_runs.stop(local):
            print(f"error: stop: local run {args.run!r} has already ended ({local.folder})", file=sys.stderr)
            return 2
        print(f"stopped {args.run}: its Ray job was asked to stop; its submit copies what it wrote to {local.folder}")
        return 0
    from environment import load_environment
    from environment.network_policy import ray_cluster_policy, rayjob_label
    from raytrain_eks import eks_backend as eks

    env = load_environment(args.env)
    namespace = env.ray.namespace
    found = eks.find_rayjob(args.run, namespace)
    if found is None:
        print(f"error: stop: no RayJob {args.run!r} in namespace {namespace} (raytrain-eks list)", file=sys.stderr)
        return 2
    # Background, not foreground: with foreground the garbage collector deletes what the RayJob
    # owns (its own RayCluster, the submitter Job; rayjob_controller.go:1021, 743) while the
    # RayJob waits, racing KubeRay's finalizer, whose StopJob then finds no head
    # (rayjob_controller.go:112-138). Background: StopJob first, the RayJob goes, then the
    # collector deletes its cluster. A clusterSelector cluster is not owned: it stays.
    from raytrain_eks.ray_stop import stop_ray_job_first

    stop_ray_job_first(found[1], namespace, print)  # its own cluster: a full stop wait, not ~30 s
    eks.kubectl("delete", "rayjob", found[0], "-n", namespace, "--cascade=background", "--wait=true")
    policy = ray_cluster_policy(rayjob_label(args.run), namespace)["metadata"]["name"]
    eks.kubectl("delete", "networkpolicy", policy, "-n", namespace, "--ignore-not-found")
    print(f"stopped {args.run}: RayJob deleted (KubeRay stops the Ray job); storage kept: "
          f"{env.storage_uri}/{args.run} (raytrain-eks submit JOB --resume {args.run})")
    return 0
