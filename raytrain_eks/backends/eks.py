"""The EKS backend of ``raytrain-eks submit/status/logs/stop/list``: what a run does on the
cluster, in three parts, each a section below: its RayJob applied and followed through kubectl
against the cluster's KubeRay operator; its own AWS identity, for a run with a cluster of its own
(a service account named after the run, which stays, and its EKS Pod Identity association with
the run role, made before the RayJob and removed by the ``submit`` that follows the run to its
end, or by ``stop``, which a RayJob KubeRay refused needs anyway); and its stop (on a run's own
cluster, the Ray job stopped through its head before the RayJob goes). The local backend
(``local.py``) is the same run on a Ray head of this machine.

Following a RayJob reads the status KubeRay v1.7.0's controller writes
(``ray-project/kuberay``, tag ``ray-operator/v1.7.0``, ``ray-operator/controllers/ray/rayjob_controller.go``
and ``ray-operator/apis/ray/v1/rayjob_types.go``): ``status.jobDeploymentStatus`` goes
``""`` (New) -> ``Initializing`` (the RayCluster is created; the job waits until the cluster's
state is ``ready``: nodes scale up, images pull) -> ``Running`` (the submitter Job runs
``ray job submit``; ``status.jobStatus`` goes ``PENDING`` -> ``RUNNING``) -> ``Complete``
(jobStatus ``SUCCEEDED`` or ``STOPPED``) or ``Failed`` (``reason`` says why: ``AppFailed``,
``DeadlineExceeded``, ...). ``ValidationFailed`` comes right after ``kubectl apply`` when the
controller refuses the spec (the apply itself succeeds; e.g. ``backoffLimit > 0`` with a
``clusterSelector``, utils/validation.go:575-576). With ``backoffLimit`` left, a failed attempt
never shows ``Failed``: the same reconcile writes ``Retrying`` (rayjob_controller.go:452,
542-555), which deletes the cluster and clears ``rayClusterName``, ``jobId`` and ``jobStatus``
on the way back to New (rayjob_controller.go:366-410); ``status.failed`` counts the failed
attempts. ``kubectl apply --server-side`` of a RayJob that exists succeeds and keeps its status:
a finished RayJob is not run again (rayjob_controller.go:420-447). Deleting a RayJob whose job is not
terminal makes the controller stop the Ray job first (its ``RayJobStopJobFinalizer``), also for
a job on the long-lived RayCluster, which stays.
"""
from __future__ import annotations

import argparse

import json
import shutil
import subprocess
import sys
import time
from typing import Any, Callable

from environment.contract import JOB_LABEL, ON_CLUSTER_SUFFIX, PART_OF, run_role_name

# --- A run's RayJob applied and followed -------------------------------------------------
TERMINAL = ("Complete", "Failed", "ValidationFailed")
"""The jobDeploymentStatus values after which KubeRay changes nothing (rayjob_types.go:
IsJobDeploymentTerminal, plus the validation refusal)."""
NEW = "New"
"""How ``status.jobDeploymentStatus == ""`` is shown (rayjob_types.go: JobDeploymentStatusNew)."""
DEADLINE_REASONS = ("DeadlineExceeded", "PreRunningDeadlineExceeded")
"""Failed reasons that free nothing by themselves (KubeRay v1.7.0 rayjob_controller.go): a
deadline only writes ``Failed`` and the reason (:1234-1262); with ``clusterSelector`` the
Complete/Failed branch then returns early (:429-432), so the Ray job keeps running and its GPUs
(and a submitter still waiting for the dashboard submits later); a job's own cluster stays for
``ttlSecondsAfterFinished`` (``handleShutdownAfterJobFinishes``). Deleting the RayJob frees them:
its finalizer calls StopJob while ``jobStatus`` is not terminal (:112-138: the job's final
checkpoint, within its stop wait) and its own cluster and submitter go with it."""


TERMINAL_JOB_STATUSES = ("SUCCEEDED", "FAILED", "STOPPED")
"""Ray's terminal job states (ray 2.58 ``dashboard/modules/job/common.py`` ``JobStatus.is_terminal``)."""
EXIT_UNREACHABLE = 5
"""Exit code of a command that could not reach the cluster (kubectl missing, no API server
answering, expired credentials, another cluster's context)."""
EXIT_REFUSED = 6
"""Exit code of a command whose request the cluster answered with a refusal (Forbidden, an
invalid object): reachable, so retrying later will not help."""

UNREACHABLE_SIGNS = ("Unable to connect to the server", "connection refused", "was refused", "no such host",
                     "i/o timeout", "TLS handshake timeout", "Unauthorized", "provide credentials",
                     "getting credentials", "ExpiredToken", "expired")
"""kubectl's words for no API server reached, or credentials it could not use (kubernetes/kubectl
``pkg/cmd/util/helpers.go`` StandardErrorMessage: "Unable to connect to the server: ..." for a
transport error; client-go's "The connection to the server HOST was refused"; the EKS token's
exec plugin "getting credentials: ..." and the API server's 401 "the server has asked for the
client to provide credentials" when the token expired). Any other kubectl failure is a refusal."""


class KubectlError(RuntimeError):
    """kubectl could not reach the cluster, or talks to no cluster of this environment; the
    message is one line. The CLI exits :attr:`exit_code` for it: not the run's failure (1), the tool's."""

    exit_code = EXIT_UNREACHABLE


class KubectlRefused(KubectlError):
    """The cluster answered and refused (kubectl's "Error from server (Forbidden|Invalid|...)",
    a client-side validation error): exit :data:`EXIT_REFUSED`."""

    exit_code = EXIT_REFUSED


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every command about one submitted run takes (status, logs, stop)."""
    parser.add_argument("run", metavar="RUN", help="the run's name (printed by submit; raytrain-eks list)")
    parser.add_argument("--env", default="environment.toml", help="environment spec (default environment.toml)")


def kubectl(*args: str, check: bool = True, capture: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("kubectl")
    if exe is None:
        raise KubectlError("kubectl is not on PATH (install it and run the cluster stack's UpdateKubeconfigCommand)")
    proc = subprocess.run([exe, *args], text=True, capture_output=capture, timeout=timeout)
    if check and proc.returncode != 0:
        text = (proc.stderr or proc.stdout or "").strip()
        lines = text.splitlines()
        kind = KubectlError if any(sign in text for sign in UNREACHABLE_SIGNS) else KubectlRefused
        raise kind(f"kubectl {' '.join(args[:3])}: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc


def check_context(cluster: str) -> None:
    """kubectl's current context must point at ``cluster``: ``aws eks update-kubeconfig`` names
    the kubeconfig cluster entry by the cluster's ARN (``arn:aws:eks:<region>:<account>:cluster/<name>``),
    a hand-made entry by its name. Another cluster would run this environment's job elsewhere."""
    proc = kubectl("config", "view", "--minify", "-o", "json", check=False)
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        raise KubectlError(f"kubectl has no current context ({lines[-1] if lines else 'exit ' + str(proc.returncode)}): "
                           f"run the cluster stack's UpdateKubeconfigCommand for {cluster}")
    contexts = json.loads(proc.stdout or "{}").get("contexts") or [{}]
    current = (contexts[0].get("context") or {}).get("cluster", "")
    if current != cluster and not current.endswith(f":cluster/{cluster}"):
        raise KubectlError(f"kubectl's current context {contexts[0].get('name', '')!r} is cluster {current!r}, not this "
                           f"environment's {cluster!r} (kubectl config use-context, or its UpdateKubeconfigCommand)")


def _not_found(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode != 0 and "NotFound" in (proc.stderr or "")


def get_rayjob(name: str, namespace: str) -> dict[str, Any] | None:
    proc = kubectl("get", "rayjob", name, "-n", namespace, "-o", "json", check=False)
    if _not_found(proc):
        return None
    if proc.returncode != 0:
        kubectl("get", "rayjob", name, "-n", namespace, "-o", "json")  # raises with kubectl's own line
    return json.loads(proc.stdout)


def find_rayjob(run: str, namespace: str) -> tuple[str, dict[str, Any]] | None:
    """``(RayJob name, RayJob)`` of a run: its own cluster's, or ``<run>-on-cluster`` on the
    long-lived RayCluster (charts/ray_charts.py names it so)."""
    for name in (run, run + ON_CLUSTER_SUFFIX):
        found = get_rayjob(name, namespace)
        if found is not None:
            return name, found
    return None


def list_rayjobs(namespace: str) -> list[dict[str, Any]]:
    """The RayJobs this project created (they carry the job label)."""
    return json.loads(kubectl("get", "rayjob", "-n", namespace, "-l", JOB_LABEL, "-o", "json").stdout).get("items", [])


def phase(rayjob: dict[str, Any]) -> tuple[str, str]:
    """``(jobDeploymentStatus, jobStatus)`` with New for the empty deployment status."""
    status = rayjob.get("status") or {}
    return status.get("jobDeploymentStatus") or NEW, status.get("jobStatus") or ""


def apply(path: str) -> None:
    # The KubeRay CRDs are too large for client-side apply's last-applied annotation.
    kubectl("apply", "--server-side", "-f", path)


def apply_policy_if_missing(policy_file: str, namespace: str, say: Callable[[str], None]) -> None:
    """Apply the run's NetworkPolicy unless each policy in the file exists (the namespace denies
    ingress by default: without it the cluster's pods never reach each other)."""
    import yaml

    with open(policy_file, encoding="utf-8") as handle:
        names = [d["metadata"]["name"] for d in yaml.safe_load_all(handle) if d]
    missing = [n for n in names if _not_found(kubectl("get", "networkpolicy", n, "-n", namespace, check=False))]
    if missing:
        # create, not apply: people who only submit may create a policy but never patch one
        # (infra/constructs/submitter_access.py SUBMITTER_RULES); each document is one run's policy.
        kubectl("create", "-f", policy_file)
        say(f"    network policy applied: {', '.join(missing)}")


def pod_waits(cluster: str, namespace: str) -> list[str]:
    """Why the cluster's pods are not running yet, one line per reason (Kubernetes pod status)."""
    if not cluster:
        return []
    proc = kubectl("get", "pods", "-n", namespace, "-l", f"ray.io/cluster={cluster}", "-o", "json", check=False)
    if proc.returncode != 0:
        return []
    reasons: dict[str, int] = {}
    for pod in json.loads(proc.stdout).get("items", []):
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                why = ("waiting for a node (cluster-autoscaler scale-up, ~6 min for GPU nodes)"
                       if cond.get("reason") == "Unschedulable" else f"not scheduled: {cond.get('reason')}")
                reasons[why] = reasons.get(why, 0) + 1
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in ("ContainerCreating", "PodInitializing"):
                why = "pulling the image / starting containers"
            elif reason in ("ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff"):
                why = f"{reason}: {waiting.get('message', '')}".strip()
            else:
                continue
            reasons[why] = reasons.get(why, 0) + 1
    return [f"{n} pod(s) {why}" for why, n in sorted(reasons.items())]


RESYNC_LINES = 5
"""How many of the last lines shown anchor a re-stream (:class:`LogResync`)."""


class LogResync:
    """Shows each line of a log streamed again and again exactly once.

    Every stream of the submitter's log starts from the top: a stream that dropped is run again
    on the same pod, and a retried submitter pod prints the Ray job's log from its start behind
    a preamble of its own (KubeRay v1.7.0 common/job.go:119-130: the first pod prints ``ray job
    submit``'s lines, a retry only ``ray job logs --follow``'s). So a re-stream is matched on
    content, not counted: its lines are held back until the last :data:`RESYNC_LINES` lines
    already shown appear in order, and everything after them is new. A stream that ends
    without that anchor shows the lines it held that were never shown."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self._anchor: list[str] = []
        self._window: list[str] = []
        self._held: list[str] = []

    def start(self) -> None:
        """A new stream begins (from the top)."""
        self._anchor = self.shown[-RESYNC_LINES:]
        self._window, self._held = [], []

    def feed(self, line: str, say: Callable[[str], None]) -> None:
        if not self._anchor:
            self.shown.append(line)
            say(line)
            return
        self._held.append(line)
        self._window = (self._window + [line])[-len(self._anchor):]
        if self._window == self._anchor:
            self._anchor, self._held = [], []  # caught up: the rest is new

    def end(self, say: Callable[[str], None]) -> None:
        """The stream ended: held lines that were never shown are shown now."""
        seen = set(self.shown)
        for line in self._held:
            if line not in seen:
                self.shown.append(line)
                say(line)
        self._anchor, self._held = [], []


def stream_submitter_log(name: str, namespace: str, *, resync: LogResync, say: Callable[[str], None]) -> tuple[int, int]:
    """``kubectl logs -f job/NAME`` (the submitter Job is named after the RayJob,
    rayjob_controller.go:724), showing only the lines ``resync`` has not shown; (exit code, new lines)."""
    proc = subprocess.Popen([shutil.which("kubectl") or "kubectl", "logs", "-f", f"job/{name}", "-n", namespace],
                            stdout=subprocess.PIPE, text=True, errors="replace")
    before = len(resync.shown)
    resync.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        resync.feed(line.rstrip("\n"), say)
    resync.end(say)
    sys.stdout.flush()
    return proc.wait(), len(resync.shown) - before


def follow(name: str, namespace: str, *, poll_s: float, say: Callable[[str], None] = print,
           stream_logs: bool = True, queue_line: Callable[[dict[str, Any]], str] = lambda rayjob: "") \
        -> dict[str, Any] | None:
    """Print each status transition and why pods wait, stream the submitter's log (the driver's
    log: each step's loss, tokens/s and ETA, evaluations, checkpoints) once the job runs, and
    return the RayJob as it ended; None when it was deleted meanwhile (`raytrain-eks stop`, or
    kubectl): a stopped run, whose storage holds what it wrote. ``queue_line`` says what is new
    of its place in a queue ("" when nothing: raytrain_eks/backends/kueue_queue.py ``QueueWatch``)."""
    seen: tuple[Any, ...] = ()
    resync = LogResync()  # the log lines of this attempt already shown
    job_id = None
    while True:
        rayjob = get_rayjob(name, namespace)
        if rayjob is None:
            say(f"    RayJob {name}: deleted (raytrain-eks stop, or kubectl): the run was stopped")
            return None
        deployment, job_status = phase(rayjob)
        status = rayjob.get("status") or {}
        queued = queue_line(rayjob)
        if status.get("jobId") and status["jobId"] != job_id:
            # A new attempt (after Retrying) is a new Ray job on a new cluster: stream its log too.
            job_id, resync = status["jobId"], LogResync()
        waits = pod_waits(status.get("rayClusterName", ""), namespace) if deployment == "Initializing" else []
        now = (deployment, job_status, tuple(waits))
        if now != seen:
            say(f"    RayJob {name}: {deployment}{' / ' + job_status if job_status else ''}"
                f"{' (cluster ' + status['rayClusterName'] + ')' if status.get('rayClusterName') else ''}")
            if deployment == "Retrying":
                say(f"      attempt {status.get('failed', 1)} failed; KubeRay retries on a new cluster "
                    f"(rayjob.backoff_limit {(rayjob.get('spec') or {}).get('backoffLimit', 0)})")
            for line in waits:
                say(f"      {line}")
            seen = now
        if queued:
            say(f"      {queued}")
        if deployment in TERMINAL:
            if status.get("reason") or status.get("message"):
                say(f"    {status.get('reason', '')}: {status.get('message', '')}".rstrip(": "))
            return rayjob
        if deployment == "Running" and stream_logs and job_status not in TERMINAL_JOB_STATUSES:
            # The submitter's log follows the driver's log to its end. kubectl exits 0 when the
            # submitter's container exits, whatever its code; KubeRay's submitter Job restarts a
            # failed one (backoffLimit 2, rayjob_controller.go:718) and the new pod runs
            # `ray job logs --follow` of the same Ray job, which prints its log from the start
            # (common/job.go:119-130): stream again, showing only lines not shown yet.
            rc, new_lines = stream_submitter_log(name, namespace, resync=resync, say=say)
            if rc == 0 and new_lines:
                continue  # the job has ended, or its submitter restarts: read the status now
            # nothing new (a finished submitter KubeRay has not marked yet, or no pod yet): wait
        time.sleep(poll_s)


# --- A run's own AWS identity ------------------------------------------------------------
# A run's own AWS identity on EKS: a service account named after the run, associated through
# EKS Pod Identity with the run role (infra/constructs/pod_identity.py ``RayIdentity.run_role``).
#
# EKS Pod Identity tags every role session with the pod's service account
# (``kubernetes-service-account``; Amazon EKS User Guide, "Grant Pods access to AWS resources based
# on tags"), and the run role's S3 grants name the run's folder through that tag: the pods of run A
# cannot reach run B's folder. An association names ONE service account (the EKS API's
# ``CreatePodIdentityAssociation`` takes ``namespace`` and ``serviceAccount``, no pattern), so each
# run gets its own, made here by ``submit`` with the operator's rights before its RayJob is
# applied, and removed once the run is over (``submit`` after the copy, ``stop``). The pipeline's
# smoke runs use a fixed account the cluster stack associates (``raytrain-smoke``). The API is eventually consistent ("may take several
# seconds to be effective"): the association is made before the RayJob, whose pods come minutes
# later (Kueue's queue, node scale-up, the image pull).
#
# The long-lived RayCluster's pods keep the spec's ``ray.service_account`` (single-team mode).


def eks_api(region: str) -> Any:
    """boto3's EKS client (the tests put a double of the Pod Identity association API here)."""
    import boto3

    return boto3.client("eks", region_name=region)


def run_service_account(run: str, namespace: str) -> dict[str, Any]:
    """The run's service account (no token automount: nothing in the Ray pods calls the Kubernetes API)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
            "metadata": {"name": run, "namespace": namespace, "labels": dict(PART_OF)}}


def run_role_arn(cluster_name: str, account: str, partition: str = "aws") -> str:
    """The run role's ARN (a fixed name: infra/constructs/pod_identity.py names it the same way)."""
    return f"arn:{partition}:iam::{account}:role/{run_role_name(cluster_name)}"


def caller_run_role(cluster_name: str, region: str) -> str:
    """The run role's ARN in the account of the credentials in use."""
    import boto3

    account, partition = caller_account(boto3.client("sts", region_name=region))
    return run_role_arn(cluster_name, account, partition)


def caller_account(sts: Any) -> tuple[str, str]:
    """``(account, partition)`` of the credentials in use."""
    arn = sts.get_caller_identity()["Arn"]
    return arn.split(":")[4], arn.split(":")[1]


def _run_associations(api: Any, cluster: str, namespace: str, run: str) -> list[dict[str, Any]]:
    found, token = [], None
    while True:
        page = api.list_pod_identity_associations(clusterName=cluster, namespace=namespace, serviceAccount=run,
                                                  **({"nextToken": token} if token else {}))
        found += page.get("associations", [])
        token = page.get("nextToken")
        if not token:
            return found


def ensure_run_identity(api: Any, *, cluster: str, namespace: str, run: str, role: str,
                        say: Callable[[str], None] = print) -> str:
    """The association of ``namespace/run`` with the run role (made unless it exists); its id."""
    found = _run_associations(api, cluster, namespace, run)
    if found:
        # The list's summaries carry no roleArn: a run named like an account another role is
        # associated with (the smoke runs', the long-lived cluster's) would borrow that role.
        theirs = _role_of(api, cluster, found[0]["associationId"])
        if theirs != role:
            raise KubectlError(f"submit: run name {run!r}: service account {namespace}/{run} is associated with "
                               f"{theirs}, not the run role {role}; choose another run name")
        return found[0]["associationId"]
    made = api.create_pod_identity_association(
        clusterName=cluster, namespace=namespace, serviceAccount=run, roleArn=role,
        tags={"app.kubernetes.io/part-of": PART_OF["app.kubernetes.io/part-of"], "raytrain.io/run": run})
    say(f"    identity: service account {namespace}/{run} -> {role} (this run's folder only)")
    return made["association"]["associationId"]


def _role_of(api: Any, cluster: str, association_id: str) -> str:
    return api.describe_pod_identity_association(clusterName=cluster, associationId=association_id)[
        "association"].get("roleArn", "")


def release_run_identity(api: Any, *, cluster: str, namespace: str, run: str, role: str) -> int:
    """Delete the run's associations with the run role ``role`` (its pods are gone: nothing else
    uses that account), never another role's; how many."""
    found = [a for a in _run_associations(api, cluster, namespace, run)
             if _role_of(api, cluster, a["associationId"]) == role]
    for association in found:
        api.delete_pod_identity_association(clusterName=cluster, associationId=association["associationId"])
    return len(found)


# --- an EKS run's Ray job stopped through its head before its RayJob goes --------------------
# Stopping an EKS run (``stop``, and a deadline's release in ``status`` and ``submit``): its Ray job
# is stopped through its own head, and waited for until terminal, BEFORE its RayJob is deleted
# (:func:`stop_ray_job_first`). Deleting the RayJob alone is not enough on a run's OWN cluster:
# KubeRay v1.7.0's finalizer calls the dashboard's StopJob, which returns at once, and removes the
# finalizer in the same reconcile (``ray-operator/controllers/ray/rayjob_controller.go:112-138``); the
# RayCluster the RayJob owns is then deleted, and each Ray container's PID 1 (``ray start --block``)
# drains for at most ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` = 30 s on SIGTERM (ray 2.58
# ``_private/ray_constants.py:40``, ``_private/node.py:629-664``) before the driver dies: the final
# checkpoint would get ~30 s, not the job's stop wait. ``ray job stop`` in the head container asks the
# job supervisor to stop the job and polls until it is STOPPED/SUCCEEDED/FAILED (ray 2.58
# ``dashboard/modules/job/cli.py:448-466``), so the job's own stop wait (``RAY_JOB_STOP_WAIT_TIME_S``,
# charts/ray_charts.py) runs in full. A ``clusterSelector`` cluster outlives the RayJob: KubeRay's StopJob
# suffices there.

HEAD_CONTAINER = "ray-head"
"""The head pod's Ray container (charts/cluster_spec.py ``RAY_CONTAINER_HEAD``)."""
DASHBOARD = "http://127.0.0.1:8265"
"""The job API, from inside the head container."""
MARGIN_S = 60
"""Beyond the job's stop wait: kubectl exec's start and Ray's 1 s polls."""
DEFAULT_STOP_WAIT_S = 600
"""A RayJob whose runtime env names no stop wait (made by hand): a generous bound."""


def stop_wait_s(rayjob: dict[str, Any]) -> int:
    """The job's ``RAY_JOB_STOP_WAIT_TIME_S`` from its runtime env (charts/ray_charts.py sets it)."""
    import yaml

    env = (yaml.safe_load((rayjob.get("spec") or {}).get("runtimeEnvYAML") or "") or {}).get("env_vars") or {}
    try:
        return int(env["RAY_JOB_STOP_WAIT_TIME_S"])
    except (KeyError, TypeError, ValueError):
        return DEFAULT_STOP_WAIT_S


def stop_ray_job_first(rayjob: dict[str, Any], namespace: str, say: Callable[[str], None]) -> None:
    """On a run's own cluster, once ready, with its Ray job not terminal: ``ray job stop`` in the head
    container (through KubeRay's head service, ``<cluster>-head-svc``), returning when the job
    is terminal or its stop wait and :data:`MARGIN_S` have passed. Failing here only says so:
    the RayJob's deletion (KubeRay's StopJob) still follows."""
    status, spec = rayjob.get("status") or {}, rayjob.get("spec") or {}
    # dashboardURL: KubeRay sets it once the cluster is ready (before it, no head to ask); an
    # empty jobStatus is a job KubeRay has not read yet, which may run all the same
    if spec.get("clusterSelector") or not status.get("dashboardURL") or status.get("jobStatus") in TERMINAL_JOB_STATUSES:
        return
    cluster, job_id = status.get("rayClusterName"), status.get("jobId")
    if not cluster or not job_id:
        return
    bound = stop_wait_s(rayjob) + MARGIN_S
    say(f"    stopping Ray job {job_id} through its head (final checkpoint; at most {bound} s)")
    try:
        proc = kubectl("exec", f"svc/{cluster}-head-svc", "-n", namespace, "-c", HEAD_CONTAINER, "--",
                       "ray", "job", "stop", "--address", DASHBOARD, job_id, check=False, timeout=bound)
    except subprocess.TimeoutExpired:
        say(f"    Ray job {job_id} not stopped within {bound} s: deleting its RayJob anyway")
        return
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        say(f"    ray job stop failed ({lines[-1] if lines else f'exit {proc.returncode}'}): deleting its RayJob anyway")


def release_after_deadline(name: str, namespace: str, rayjob: dict[str, Any], say: Callable[[str], None]) -> bool:
    """Delete a RayJob that failed on a deadline (:data:`DEADLINE_REASONS`); True if it did."""
    status = rayjob.get("status") or {}
    if status.get("jobDeploymentStatus") != "Failed" or status.get("reason") not in DEADLINE_REASONS:
        return False
    stop_ray_job_first(rayjob, namespace, say)  # its own cluster: a full stop wait, not ~30 s
    kubectl("delete", "rayjob", name, "-n", namespace, "--wait=false", "--ignore-not-found")
    say(f"    {status['reason']}: RayJob {name} deleted, so KubeRay stops its Ray job (final checkpoint) "
        "and its GPUs are freed; its checkpoints stay")
    return True
