"""Deploy waits as Apply does: a commit whose cluster-stack update rolls, replaces or deletes a
GPU node group waits for the running GPU jobs and the maintenance window (apply_promote.py
clear_to_disturb: ONE definition for both), one that does not deploys at once.

The templates are the real CDK synth of the spec before and after each edit (tests/update_oracle.py
templates); the running jobs are RayJob objects as KubeRay v1.7.0 reports them
(``ray-project/kuberay`` tag ``ray-operator/v1.7.0``, ``apis/ray/v1/rayjob_types.go``:
``status.jobDeploymentStatus``, terminal ``Complete``/``Failed``), listed by a double of
``kubectl get rayjobs`` that lets each job run for a given number of polls, as the pipeline's
fake kubectl does (fake_kubectl.py ``polls_left``)."""
from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest

from environment import environment_from_dict
from infra_variants import default_raw
from raytrain_eks.pipeline.apply_promote import Deferred, gpu_node_changes, hold_deploy
from update_oracle import edited, redeploy, templates


class Jobs:
    """``kubectl get rayjobs``: each job Running for ``polls`` lists (None: forever), then Complete."""

    def __init__(self, **polls):
        self.polls, self.lists = polls, 0

    def rayjobs(self):
        self.lists += 1
        return [{"metadata": {"name": name}, "spec": {"entrypoint": "python -m training"},  # its own RayCluster
                 "status": {"jobDeploymentStatus": "Running" if n is None or self.lists <= n else "Complete"}}
                for name, n in self.polls.items()]


def _ctx(raw: dict, kube: Jobs) -> SimpleNamespace:
    return SimpleNamespace(env=environment_from_dict(raw, "environment.toml"), kube=kube, poll_s=0)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 60.0  # each poll a minute later
        return self.t


@pytest.fixture(scope="module")
def deployed() -> dict:
    return redeploy(default_raw(), templates(default_raw()))["cluster"]


@pytest.mark.parametrize("edit, effect", [
    ("gpu root_volume_gib 200 -> 300", "rolls every node"),
    ("gpu instance_type -> g6.48xlarge", "is replaced"),
    ("cluster gpu_availability_zone -> us-east-1b", "is replaced"),
])
def test_a_deploy_that_rolls_or_replaces_a_gpu_group_waits_for_the_running_jobs(deployed, edit, effect):
    raw = edited(default_raw(), edit)
    new = redeploy(raw, {"cluster": deployed})["cluster"]
    [change] = gpu_node_changes(deployed, new)
    assert effect in change
    # a job that ends after 3 polls: Deploy waits for it, and says so
    kube = Jobs(**{"finetune": 3})
    why = hold_deploy(_ctx(raw, kube), deployed, new, clock=Clock())
    assert "waited" in why and "finetune" in why and kube.lists == 4
    # one that does not end within pipeline.apply_wait_minutes: deferred, nothing deployed
    with pytest.raises(Deferred, match="finetune still running on the GPU node groups"):
        hold_deploy(_ctx(raw, Jobs(finetune=None)), deployed, new, clock=Clock())


def test_a_deploy_outside_the_maintenance_window_defers_like_apply(deployed):
    raw = edited(default_raw(), "gpu root_volume_gib 200 -> 300")
    raw.setdefault("pipeline", {})["maintenance_window"] = "sat 02:00-04:00"
    new = redeploy(raw, {"cluster": deployed})["cluster"]
    monday = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.timezone.utc)
    with pytest.raises(Deferred, match="outside the maintenance window"):
        hold_deploy(_ctx(raw, Jobs()), deployed, new, now=lambda: monday)


def test_a_scaling_edit_deploys_at_once_under_running_jobs(deployed):
    raw = edited(default_raw(), "gpu max_nodes 2 -> 3")
    new = redeploy(raw, {"cluster": deployed})["cluster"]
    assert gpu_node_changes(deployed, new) == []
    kube = Jobs(finetune=None)
    assert "no GPU node group" in hold_deploy(_ctx(raw, kube), deployed, new) and kube.lists == 0


@pytest.mark.parametrize("edit, effect", [
    ({"system_node_group.instance_type": "m6i.xlarge"}, "is replaced"),
    ({"system_node_group.disk_gib": 200}, "rolls every node"),
])
def test_a_deploy_that_rolls_or_replaces_the_system_nodes_waits_for_the_running_jobs(deployed, edit, effect):
    """Every Ray head runs on the system nodes (charts/ray_charts.py: "a head on the system nodes"):
    replacing them (InstanceTypes is create-only on AWS::EKS::Nodegroup, cfn-lint's schema; the
    update oracle says NODES TERMINATED) or rolling them (a new launch template version: NODES
    ROLLED) evicts the head of every running job, which ends it. Before the fix the hold looked at
    the GPU groups only and deployed this at once under running jobs."""
    from update_oracle import _set, diff, touches_running

    raw = default_raw()
    for path, value in edit.items():
        raw = _set(raw, path, value)
    new = redeploy(raw, {"cluster": deployed})["cluster"]
    oracle = [c for c in touches_running(diff({"cluster": deployed}, {"cluster": new})) if "SystemNodes" in c.logical_id]
    assert oracle, "the update oracle sees no effect on the system nodes"
    changes = gpu_node_changes(deployed, new)
    assert any("system" in line and effect in line for line in changes), changes
    with pytest.raises(Deferred, match="finetune still running"):
        hold_deploy(_ctx(raw, Jobs(finetune=None)), deployed, new, clock=Clock())


def test_a_deploy_retried_alone_after_a_job_started_refuses_and_the_stage_retry_waits(deployed):
    """The retry sequence on the hold's own terms: HoldDeploy passes with no job running, Deploy
    fails, three hours later a fine-tune runs and "Retry failed actions" reruns DeployStacks alone
    (CodePipeline RetryStageExecution, retryMode FAILED_ACTIONS: the succeeded HoldDeploy is not
    rerun). Deploy refuses that pass and names "Retry stage"; the stage retry (ALL_ACTIONS) runs
    the hold again, which now sees the job and waits for it (here: defers, nothing deployed)."""
    from raytrain_eks.pipeline.apply_promote import HOLD_MAX_AGE_MINUTES, HoldExpired, check_hold_fresh

    raw = edited(default_raw(), "gpu root_volume_gib 200 -> 300")  # rolls every GPU node
    new = redeploy(raw, {"cluster": deployed})["cluster"]
    passed_at = 1_800_000_000.0
    assert "no RayJob runs" in hold_deploy(_ctx(raw, Jobs()), deployed, new)
    assert "passed 60 s ago" in check_hold_fresh(f"{passed_at:.0f}", passed_at + 60)  # the first Deploy
    # the retried Deploy, 3 h later, a job running now
    with pytest.raises(HoldExpired, match=rf"passed 180 min before .*at most {HOLD_MAX_AGE_MINUTES} min.*'Retry stage'"):
        check_hold_fresh(f"{passed_at:.0f}", passed_at + 3 * 3600)
    with pytest.raises(HoldExpired, match="no HoldDeploy pass"):
        check_hold_fresh("", passed_at)
    # Retry stage: the hold runs again and sees the fine-tune
    with pytest.raises(Deferred, match="finetune still running"):
        hold_deploy(_ctx(raw, Jobs(finetune=None)), deployed, new, clock=Clock())


def test_a_malformed_or_future_hold_pass_is_refused_naming_the_value():
    """``float()`` reads ``nan``, ``inf`` and ``1e9`` as numbers, and a HOLD_PASSED_AT ahead of
    this build's clock by more than the skew allowed is no age at all: each is refused with the
    value and what is allowed, not as "passed nan min before" or "passed -60 min before ... a GPU
    job may run since" (a wrong reason that hides the clock or the variable at fault)."""
    from raytrain_eks.pipeline.apply_promote import HoldExpired, check_hold_fresh

    now = 1_800_000_000.0
    for value in ("nan", "inf", "-inf"):
        with pytest.raises(HoldExpired, match=rf"HOLD_PASSED_AT = '{value}': not epoch seconds"):
            check_hold_fresh(value, now)
    with pytest.raises(HoldExpired, match=r"HOLD_PASSED_AT = '1800003600': 3600 s after this build's clock "
                                          r"\(at most 60 s of skew\)"):
        check_hold_fresh("1800003600", now)
    assert "passed 0 s ago" in check_hold_fresh("1800000030", now)  # within the skew: a pass now
