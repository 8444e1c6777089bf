"""Every synthesized RayJob's deadlines and retries as KubeRay v1.7.0's controller runs them
(charts_oracles/kuberay_rayjob_lifecycle.py), and the job configs that would defeat them."""
from __future__ import annotations

import contextlib

import pytest
from charts_oracles.kuberay_rayjob_lifecycle import (DEADLINE_EXCEEDED, DEFAULT_SUBMITTER_BACKOFF_LIMIT,
                                                      PRE_RUNNING_DEADLINE_EXCEEDED, attempts_without_capacity,
                                                      initializing_verdict, running_verdict,
                                                      submitter_fails_the_rayjob)
from charts_testspec import make_env
from test_charts_errors import gpu_job, job_root, plan_error

from charts.jobs import plan_jobs, pre_running_deadline_seconds
from charts.ray_charts import SUBMITTER_BACKOFF_LIMIT


def rayjobs(synth):
    return [(chart, o["spec"]) for chart, objs in synth.docs.items() for o in objs if o["kind"] == "RayJob"]


def test_a_cluster_that_never_comes_up_fails_on_the_pre_running_deadline(default_synth):
    jobs = rayjobs(default_synth)
    assert jobs
    for chart, spec in jobs:
        pre = spec["preRunningDeadlineSeconds"]
        assert initializing_verdict(spec, pre - 1) is None, chart
        assert initializing_verdict(spec, pre) == PRE_RUNNING_DEADLINE_EXCEEDED, chart
        # once running, only the active deadline applies, counted from the same start
        assert running_verdict(spec, spec["activeDeadlineSeconds"]) == DEADLINE_EXCEEDED, chart


def test_the_oracle_checks_the_active_deadline_first():
    # rayjob_controller.go, Initializing: checkActiveDeadline... before checkPreRunningDeadline...
    spec = {"activeDeadlineSeconds": 600, "preRunningDeadlineSeconds": 1080}
    assert initializing_verdict(spec, 1080) == DEADLINE_EXCEEDED


def test_a_pre_running_failure_is_retried_up_to_the_backoff_limit(default_synth):
    for chart, spec in rayjobs(default_synth):
        expected = 1 + spec.get("backoffLimit", 0)
        assert attempts_without_capacity(spec) == expected, chart


@pytest.mark.parametrize("minutes", [1, int(pre_running_deadline_seconds() / 60)])
def test_an_active_deadline_not_past_the_pre_running_one_is_refused(tmp_path, minutes):
    job = gpu_job(extra=f"[rayjob]\nactive_deadline_minutes = {minutes}")
    assert plan_error(job_root(tmp_path, bad=job)) == (
        f"jobs/bad.toml: rayjob.active_deadline_minutes: {minutes} is not longer than the "
        f"{pre_running_deadline_seconds() / 60:g} minutes the job's cluster may take to come up "
        "(preRunningDeadlineSeconds, counted from the same start): the job would be killed before its cluster is up")


def test_a_queued_job_admitted_as_another_ends_is_running_before_its_pre_running_deadline(default_synth):
    """Kueue v0.19.2 frees the quota of a RayJob once it is Complete/Failed
    (kueue pkg/controller/jobframework/reconciler.go:483-504, pkg/controller/core/workload_controller.go:1403-1424)
    and admits the next one, whose deadlines start then (KubeRay rayjob_controller.go:411-418,
    887-917); its pods wait for the ended job's cluster, which KubeRay deletes
    ttlSecondsAfterFinished after the end, then for a scale-up."""
    from environment.addons import SCALE_UP_MINUTES

    queued = [(chart, spec) for chart, spec in rayjobs(default_synth) if spec.get("suspend")]
    assert queued
    for ended_chart, ended in queued:
        waits = ended["ttlSecondsAfterFinished"] + SCALE_UP_MINUTES * 60
        for chart, spec in queued:
            assert initializing_verdict(spec, waits) is None, (ended_chart, chart)


def test_a_ttl_that_would_outlast_the_next_jobs_pre_running_deadline_is_refused(tmp_path):
    from environment.addons import SCALE_UP_MINUTES

    most = pre_running_deadline_seconds() - int(SCALE_UP_MINUTES * 60)
    (tmp_path / "most").mkdir()
    root = job_root(tmp_path / "most", bad=gpu_job(extra=f"[rayjob]\nttl_seconds_after_finished = {most}"))
    with contextlib.chdir(root):
        assert [p.config.rayjob.ttl_seconds_after_finished for p in plan_jobs(make_env(), root / "jobs", root)] == [most]
    assert plan_error(job_root(tmp_path, bad=gpu_job(extra=f"[rayjob]\nttl_seconds_after_finished = {most + 1}"))) == (
        f"jobs/bad.toml: rayjob.ttl_seconds_after_finished: {most + 1} keeps the ended job's cluster, and its nodes, "
        "longer than the next queued job can wait for them: it is admitted as this job ends and must be running "
        f"within {pre_running_deadline_seconds() / 60:g} minutes (preRunningDeadlineSeconds), a scale-up "
        f"(~{SCALE_UP_MINUTES:g} min) included: at most {most}")


def test_a_dropped_log_stream_does_not_fail_a_running_job(default_synth):
    # `ray job logs --follow` exits non-zero on an abnormal websocket close; three such drops
    # would fail the RayJob (and delete its cluster) under KubeRay's default submitter backoff
    for chart, spec in rayjobs(default_synth):
        assert not submitter_fails_the_rayjob(spec, DEFAULT_SUBMITTER_BACKOFF_LIMIT + 1), chart
        assert not submitter_fails_the_rayjob(spec, SUBMITTER_BACKOFF_LIMIT), chart
        assert submitter_fails_the_rayjob(spec, SUBMITTER_BACKOFF_LIMIT + 1), chart
