"""Kueue's rules for a RayJob: what its webhooks do at ``kubectl apply`` and whether its
scheduler can ever admit the job against the ClusterQueue.

Port of ``kubernetes-sigs/kueue`` tag ``v0.19.2`` (default configuration: ``manageJobsWithoutQueueName``
false, TopologyAwareScheduling and workload slicing off):

- ``pkg/controller/jobs/rayjob/rayjob_webhook.go:107-158`` ``validateCreate``: only a job with the
  queue-name label is judged; ``clusterSelector`` with ``rayClusterSpec`` is refused, ``clusterSelector``
  alone is valid and unmanaged, neither is refused; ``shutdownAfterJobFinishes`` must be true;
  then ``raycluster.ValidateCreate`` (``pkg/controller/jobs/raycluster/common.go:298-329``): no
  ``enableInTreeAutoscaling``, at most ``jobframework.MaxPodSets`` (18, ``constants.go:21``) pod
  sets, no worker group named ``head``; and ``jobframework.ValidateQueueName``
  (``validation.go:146-178``): the label value is a DNS-1123 subdomain.
- ``rayjob_webhook.go:77-90`` ``Default`` -> ``jobframework/defaults.go:36-46`` and
  ``utils.go:131-157``: a job with the queue-name label is SUSPENDED at creation, whatever else
  it is; ``rayjob_controller.go:116-120`` ``Skip``: a ``clusterSelector`` job is never reconciled
  (never unsuspended).
- pod sets (``rayjob_controller.go:133-164, 288-311``; ``raycluster/common.go:60-125``
  ``BuildPodSets``): ``head`` (count 1), one per worker group (``replicas`` x ``numOfHosts``, as the
  CRD defaults them: 0 and 1), and
  ``submitter`` (count 1) in K8sJobMode, its template or KubeRay's default submitter resources
  (``rayjob_controller.go:249-263``: 500m / 200Mi requests).
- flavor assignment (``pkg/scheduler/flavorassigner/flavorassigner.go:1208-1256`` and
  ``flavorSelector`` :1278-): a flavor fits a pod set when the pod tolerates the flavor's
  NoSchedule/NoExecute ``nodeTaints`` and the pod's nodeSelector, restricted to the keys of THAT
  flavor's ``nodeLabels``, matches them; quota (``fitsResourceQuota`` :1330-): without
  borrowing or preemption, a flavor's usage plus the request stays within its ``nominalQuota``
  for every resource; a resource the resource group does not cover cannot be assigned.
  With usage, a request within the quota that the usage leaves short of it reads "insufficient
  unused quota for R in flavor F, N more needed" (:1364-1369).
  Requests per pod: the containers' sum (a limit stands in for a missing request,
  ``workload.AdjustResources``), the larger of that and any init container.
"""
from __future__ import annotations

import re
from fractions import Fraction

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
MAX_POD_SETS = 18
HEAD_POD_SET = "head"
SUBMITTER_POD_SET = "submitter"
DEFAULT_SUBMITTER_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SUFFIX = {"m": Fraction(1, 1000), "": Fraction(1), "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
           "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40)}


def quantity(text: str | int) -> Fraction:
    """A Kubernetes quantity (``200m``, ``8Gi``, ``4``) in base units."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(text))
    assert match and match.group(2) in _SUFFIX, f"quantity {text!r} not ported"
    return Fraction(match.group(1)) * _SUFFIX[match.group(2)]


def _amount(value: Fraction) -> str:
    """A quantity as Kubernetes prints it (``8``, ``1500m``, ``12Gi``)."""
    if value.denominator == 1:
        for suffix in ("Gi", "Mi"):
            if value % _SUFFIX[suffix] == 0:
                return f"{value // _SUFFIX[suffix]}{suffix}"
        return str(value)
    return f"{int(value * 1000)}m"


def queue_name(rayjob: dict) -> str:
    return ((rayjob.get("metadata") or {}).get("labels") or {}).get(QUEUE_NAME_LABEL, "")


def validate_create(rayjob: dict) -> list[str]:
    """The webhook's refusals of a new RayJob (empty: admitted to the API server)."""
    if not queue_name(rayjob):
        return []
    spec, errors = rayjob["spec"], []
    selector, cluster = bool(spec.get("clusterSelector")), spec.get("rayClusterSpec")
    if selector and cluster is not None:
        return ["spec.clusterSelector: a kueue managed job should not use an existing cluster"]
    if not selector and cluster is None:
        return ["spec.rayClusterSpec: rayClusterSpec is required for Kueue-managed jobs that don't use clusterSelector"]
    if cluster is not None:
        if spec.get("shutdownAfterJobFinishes") is not True:
            errors.append("spec.shutdownAfterJobFinishes: a kueue managed job should delete the cluster after finishing")
        if cluster.get("enableInTreeAutoscaling") is True:
            errors.append("spec.rayClusterSpec.enableInTreeAutoscaling: a kueue managed job should only use "
                          "autoscaling when workload slicing is enabled")
        groups = cluster.get("workerGroupSpecs") or []
        if len(groups) + 1 > MAX_POD_SETS:
            errors.append(f"spec.rayClusterSpec.workerGroupSpecs: must have at most {MAX_POD_SETS} items")
        errors += [f"spec.rayClusterSpec.workerGroupSpecs[{i}].groupName: \"head\" is reserved for the head group"
                   for i, g in enumerate(groups) if g.get("groupName") == HEAD_POD_SET]
    name = queue_name(rayjob)
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        errors.append(f"metadata.labels[{QUEUE_NAME_LABEL}]: {name!r} is not a DNS-1123 subdomain")
    return errors


def suspended_at_creation(rayjob: dict) -> bool:
    """What the mutating webhook leaves in ``spec.suspend``."""
    return bool(queue_name(rayjob)) or rayjob["spec"].get("suspend") is True


def managed(rayjob: dict) -> bool:
    """Whether Kueue's reconciler ever admits (unsuspends) it."""
    return bool(queue_name(rayjob)) and not rayjob["spec"].get("clusterSelector")


def pod_requests(pod_spec: dict) -> dict[str, Fraction]:
    def of(container: dict) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items() if v is not None}
    total: dict[str, Fraction] = {}
    for container in pod_spec.get("containers") or []:
        for key, value in of(container).items():
            total[key] = total.get(key, Fraction(0)) + value
    for init in pod_spec.get("initContainers") or []:
        for key, value in of(init).items():
            total[key] = max(total.get(key, Fraction(0)), value)
    return total


def pod_sets(rayjob: dict) -> list[dict]:
    """``[{name, count, template}]`` as the Workload gets them."""
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    sets = [{"name": HEAD_POD_SET, "count": 1, "template": cluster["headGroupSpec"]["template"]}]
    for group in cluster.get("workerGroupSpecs") or []:
        # What Kueue sees is the object after the API server applied the CRD's defaults
        # (KubeRay v1.7.0 ray.io_rayjobs.yaml: replicas 0, numOfHosts 1), so its "1 when unset"
        # (raycluster/common.go:64-74 effectiveWorkerCount) never applies to a RayJob.
        count = group.get("replicas", 0) * max(1, group.get("numOfHosts", 1))
        sets.append({"name": group["groupName"], "count": count, "template": group["template"]})
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
        template = spec.get("submitterPodTemplate") or {"spec": {"containers": [
            {"resources": {"requests": DEFAULT_SUBMITTER_REQUESTS}}]}}
        sets.append({"name": SUBMITTER_POD_SET, "count": 1, "template": template})
    return sets


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def flavor_fits_pod(flavor: dict, pod_spec: dict) -> str | None:
    """None when ``flavor`` may hold this pod, else Kueue's reason."""
    name, fspec = flavor["metadata"]["name"], flavor.get("spec") or {}
    for taint in fspec.get("nodeTaints") or []:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not _tolerates(
                (pod_spec.get("tolerations") or []) + (fspec.get("tolerations") or []), taint):
            return f"untolerated taint {taint['key']} in flavor {name}"
    labels = fspec.get("nodeLabels") or {}
    selector = {k: v for k, v in (pod_spec.get("nodeSelector") or {}).items() if k in labels}
    assert not (pod_spec.get("affinity") or {}).get("nodeAffinity"), "node affinity not ported"
    if any(labels[k] != v for k, v in selector.items()):
        return f"flavor {name} doesn't match node affinity"
    return None


def admission(rayjob: dict, cluster_queue: dict, flavors: list[dict],
              usage: dict[str, dict[str, Fraction]] | None = None,
              sets: list[dict] | None = None) -> tuple[dict[str, str], list[str]]:
    """Flavor per pod set, and why it cannot be admitted now (empty: it is) given ``usage``
    (flavor -> resource -> reserved, updated in place when it is admitted); with no usage:
    whether it can EVER be admitted. ``sets``: another job's pod sets (default: the RayJob's)."""
    by_name = {f["metadata"]["name"]: f for f in flavors}
    group = cluster_queue["spec"]["resourceGroups"][0]
    assert len(cluster_queue["spec"]["resourceGroups"]) == 1, "one resource group ported"
    covered = set(group["coveredResources"])
    quota = {f["name"]: {r["name"]: quantity(r["nominalQuota"]) for r in f["resources"]} for f in group["flavors"]}
    used = {f: dict(r) for f, r in (usage or {}).items()}
    chosen, problems = {}, []
    for ps in (pod_sets(rayjob) if sets is None else sets):
        request = {k: v * ps["count"] for k, v in pod_requests(ps["template"]["spec"]).items() if v}
        missing = set(request) - covered
        if missing:
            problems.append(f"pod set {ps['name']}: resource {sorted(missing)[0]} unavailable in ClusterQueue")
            continue
        reasons = []
        for flavor in group["flavors"]:
            why = flavor_fits_pod(by_name[flavor["name"]], ps["template"]["spec"])
            if why is None:
                have = used.setdefault(flavor["name"], {})
                short = [r for r, v in request.items() if have.get(r, 0) + v > quota[flavor["name"]].get(r, 0)]
                if not short:
                    for r, v in request.items():
                        have[r] = have.get(r, 0) + v
                    chosen[ps["name"]] = flavor["name"]
                    break
                why = f"insufficient quota for {short[0]} in flavor {flavor['name']}"
                if usage is not None and request[short[0]] <= quota[flavor["name"]].get(short[0], 0):
                    more = have.get(short[0], 0) + request[short[0]] - quota[flavor["name"]][short[0]]
                    why = f"insufficient unused quota for {short[0]} in flavor {flavor['name']}, {_amount(more)} more needed"
            reasons.append(why)
        else:
            problems.append(f"couldn't assign flavors to pod set {ps['name']}: {'; '.join(reasons)}")
    if usage is not None and not problems:
        usage.update(used)
    return chosen, problems
