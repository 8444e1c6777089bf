"""The run identity admission policy (infra/constructs/pod_identity.py ``run_identity_admission``)
on the REAL kube-apiserver (v1.36, built from source: tests/cluster/plane.py), against the RayJobs
the product synthesizes and the KubeRay v1.7.0 CRDs: a submitter (the shipped
``raytrain-submitters`` RBAC, by impersonation) who names another run's or a platform service
account in a head, worker or submitter pod template is refused; the run's own account, the
pipeline's smoke account from the pipeline's group, the long-lived RayCluster's account and
KubeRay's own copies are admitted. Only etcd and the apiserver run: admission needs no
controller (``Plane.start(controllers=False)``). Every request is a server-side dry run, which
the apiserver admits or refuses exactly as a create."""
from __future__ import annotations

import copy

import pytest
import yaml

from environment.contract import DEPLOYER_GROUP, SUBMITTERS_GROUP
from plane import Plane, PlaneError, spec
from test_manifests import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster")]

RUNS = "runs"
BARE = "bare"  # a namespace the binding does not select: what the plane admits without the policy
SUBMITTER = ["--as=alice@example.com", f"--as-group={SUBMITTERS_GROUP}"]
PIPELINE = ["--as=codebuild-smoke", f"--as-group={DEPLOYER_GROUP}"]
OPERATOR = ["--as=system:serviceaccount:kuberay-system:kuberay-operator"]


@pytest.fixture(scope="module")
def api(tmp_path_factory, shipped):
    from infra.constructs.pod_identity import run_identity_admission
    from infra.constructs.submitter_access import SUBMITTER_RULES, namespace_group_rbac
    from infra.stacks.pipeline_access import DEPLOYER_RULES

    env = spec(RUNS)
    plane = Plane(workdir=tmp_path_factory.mktemp("admission"), cluster_name=env.cluster.eks_name)
    try:
        plane.start(env, controllers=False)
    except (PlaneError, OSError) as err:
        plane.stop()
        pytest.fail(f"the apiserver did not start: {err}", pytrace=False)
    try:
        objects = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BARE}},
                   _role_for("ray-operator", [{"apiGroups": ["ray.io"], "resources": ["rayclusters", "rayjobs"],
                                               "verbs": ["create", "update", "patch"]}],
                             {"kind": "User", "name": OPERATOR[0].split("=", 1)[1]})]
        for ns in (RUNS, BARE):
            # the groups' Roles and bindings as the stacks ship them
            objects += [*namespace_group_rbac(SUBMITTERS_GROUP, ns, SUBMITTER_RULES, "submitters"),
                        *namespace_group_rbac(DEPLOYER_GROUP, ns, DEPLOYER_RULES, "pipeline")]
        plane.apply_objects(objects)
        plane.apply_objects(run_identity_admission(
            namespace=RUNS, raycluster_name=env.cluster.name, cluster_account=env.ray.service_account,
            operator_namespace="kuberay-system", pipeline_group=DEPLOYER_GROUP))
        # The apiserver enforces a policy once its informer has it (asynchronously, seconds).
        borrowing = _with(_shipped_rayjob(shipped), "head", "run-b")
        wait_for("the policy in force", lambda: _create((plane, env), borrowing, RUNS, SUBMITTER).returncode != 0)
        yield plane, env
    finally:
        plane.stop()


def _role_for(name: str, rules: list[dict], subject: dict, namespace: str = RUNS) -> dict:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": namespace}, "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": name, "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", **subject}]}
    return {"apiVersion": "v1", "kind": "List", "items": [role, binding]}


def _shipped_rayjob(shipped) -> dict:
    """A RayJob with a cluster of its own as the cdk8s app writes it (head, one worker group,
    submitter), its pods on the account named after the run."""
    for path in sorted(shipped.glob("rayjob-*.k8s.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "RayJob" and "rayClusterSpec" in doc["spec"]:
                return doc
    raise AssertionError(f"no RayJob with a cluster of its own in {shipped}")


def _create(api, obj: dict, namespace: str, who: list[str]):
    plane, _ = api
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = namespace
    return plane.kubectl("create", "--dry-run=server", *who, "-f", "-", input=yaml.safe_dump(obj), check=False)


def _with(job: dict, where: str, account: str | None) -> dict:
    job = copy.deepcopy(job)
    cluster = job["spec"].get("rayClusterSpec", job["spec"])
    template = {"head": lambda: cluster["headGroupSpec"]["template"],
                "worker": lambda: cluster["workerGroupSpecs"][0]["template"],
                "submitter": lambda: job["spec"]["submitterPodTemplate"]}[where]()
    if account is None:
        template["spec"].pop("serviceAccountName", None)
    else:
        template["spec"]["serviceAccountName"] = account
    return job


def test_the_shipped_rayjob_names_its_own_run(shipped):
    job = _shipped_rayjob(shipped)
    cluster = job["spec"]["rayClusterSpec"]
    run = job["metadata"]["name"]
    assert cluster["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == run
    assert {g["template"]["spec"]["serviceAccountName"] for g in cluster["workerGroupSpecs"]} == {run}


@pytest.mark.parametrize("where", ["head", "worker", "submitter"])
@pytest.mark.parametrize("borrowed", ["run-b", "ray-train", "raytrain-smoke"])
def test_a_submitter_naming_another_account_is_refused(api, shipped, where, borrowed):
    job = _with(_shipped_rayjob(shipped), where, borrowed)
    # without the policy (a namespace it does not select) the plane admits it: the hole is real
    bare = _create(api, job, BARE, SUBMITTER)
    assert bare.returncode == 0, bare.stderr
    refused = _create(api, job, RUNS, SUBMITTER)
    assert refused.returncode != 0
    assert "ValidatingAdmissionPolicy" in refused.stderr and f"serviceAccountName '{borrowed}'" in refused.stderr, \
        refused.stderr
    print(refused.stderr.strip())


def test_the_entitled_account_and_none_are_admitted(api, shipped):
    job = _shipped_rayjob(shipped)
    assert _create(api, job, RUNS, SUBMITTER).returncode == 0
    for where in ("head", "worker", "submitter"):
        proc = _create(api, _with(job, where, None), RUNS, SUBMITTER)
        assert proc.returncode == 0, (where, proc.stderr)
    # a run may not take a platform account's name to get it
    named = copy.deepcopy(job)
    named["metadata"]["name"] = "ray-train"
    for where in ("head", "worker"):
        named = _with(named, where, "ray-train")
    proc = _create(api, named, RUNS, SUBMITTER)
    assert proc.returncode != 0 and "serviceAccountName 'ray-train'" in proc.stderr, proc.stderr


def test_a_cluster_without_worker_groups_or_submitter_is_judged(api, shipped):
    job = _shipped_rayjob(shipped)
    bare = copy.deepcopy(job)
    bare["spec"]["rayClusterSpec"].pop("workerGroupSpecs")
    bare["spec"].pop("submitterPodTemplate")
    bare["spec"].pop("submitterConfig", None)
    assert _create(api, bare, RUNS, SUBMITTER).returncode == 0
    proc = _create(api, _with(bare, "head", "run-b"), RUNS, SUBMITTER)
    assert proc.returncode != 0 and "serviceAccountName 'run-b'" in proc.stderr, proc.stderr
    # a RayJob on the long-lived cluster: no rayClusterSpec at all
    selector = copy.deepcopy(job)
    selector["spec"].pop("rayClusterSpec")
    selector["spec"]["clusterSelector"] = {"ray.io/cluster": "raytrain"}
    assert _create(api, selector, RUNS, SUBMITTER).returncode == 0
    proc = _create(api, _with(selector, "submitter", "ray-train"), RUNS, SUBMITTER)
    assert proc.returncode != 0 and "serviceAccountName 'ray-train'" in proc.stderr, proc.stderr


def test_the_platform_identities_keep_their_accounts(api, shipped):
    _, env = api
    job = _shipped_rayjob(shipped)
    smoke = job
    for where in ("head", "worker"):
        smoke = _with(smoke, where, "raytrain-smoke")
    # the pipeline's Smoke build (smoke.py sets the account); a submitter may not
    assert _create(api, smoke, RUNS, PIPELINE).returncode == 0
    assert _create(api, smoke, RUNS, SUBMITTER).returncode != 0
    # the long-lived RayCluster (dist/raycluster.k8s.yaml) under its name, by the pipeline's Apply
    [cluster] = [d for d in yaml.safe_load_all((shipped / "raycluster.k8s.yaml").read_text()) if d]
    assert cluster["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == env.ray.service_account
    assert _create(api, cluster, RUNS, PIPELINE).returncode == 0
    renamed = copy.deepcopy(cluster)
    renamed["metadata"]["name"] = "not-the-long-lived"
    proc = _create(api, renamed, RUNS, PIPELINE)
    assert proc.returncode != 0 and f"serviceAccountName '{env.ray.service_account}'" in proc.stderr, proc.stderr
    # KubeRay's RayCluster for a RayJob copies a spec already judged
    copied = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
              "metadata": {"name": job["metadata"]["name"] + "-x7k2p"}, "spec": smoke["spec"]["rayClusterSpec"]}
    assert _create(api, copied, RUNS, OPERATOR).returncode == 0


def test_an_update_may_keep_but_never_add_an_account(api, shipped):
    """The Ray autoscaler (the long-lived head's account) patches its RayCluster's replicas; it
    may not move a worker group onto another account."""
    plane, env = api
    [cluster] = [d for d in yaml.safe_load_all((shipped / "raycluster.k8s.yaml").read_text()) if d]
    cluster["metadata"]["namespace"] = RUNS
    plane.kubectl("create", *PIPELINE, "-f", "-", input=yaml.safe_dump(cluster))
    name = cluster["metadata"]["name"]
    autoscaler = [f"--as=system:serviceaccount:{RUNS}:{env.ray.service_account}"]
    plane.apply_objects([_role_for("autoscaler", [{"apiGroups": ["ray.io"], "resources": ["rayclusters"],
                                                   "verbs": ["get", "patch"]}],
                                   {"kind": "User", "name": autoscaler[0].split("=", 1)[1]})])
    replicas = '[{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]'
    patched = plane.kubectl("patch", "raycluster", name, "-n", RUNS, *autoscaler, "--type=json", "-p", replicas,
                            check=False)
    assert patched.returncode == 0, patched.stderr
    borrow = ('[{"op": "add", "path": "/spec/workerGroupSpecs/0/template/spec/serviceAccountName", '
              '"value": "run-b"}]')
    refused = plane.kubectl("patch", "raycluster", name, "-n", RUNS, *autoscaler, "--type=json", "-p", borrow,
                            check=False)
    assert refused.returncode != 0 and "serviceAccountName 'run-b'" in refused.stderr, refused.stderr
    plane.kubectl("delete", "raycluster", name, "-n", RUNS, "--wait=false", check=False)
