"""Targeted checks: every figure in the manifests derives from the spec and the job config."""
from __future__ import annotations

import copy
import shlex

import pytest
import yaml
from charts_testspec import ACCOUNT, TEST_DIGEST, make_env

from charts.cluster_spec import ClusterShape, ray_cluster_spec
from charts.ray_charts import LONG_LIVED_CHECKPOINT_GRACE_SECONDS
from charts.jobs import PRE_RUNNING_FACTOR
from environment.addons import SCALE_UP_MINUTES
from environment.contract import EFA_RESOURCE, GPU_RESOURCE, NODE_GROUP_LABEL, run_folder
from training.contract import job_config_hash, label_hash
from training.config import load_job_config
from training.contract import STOP_MARGIN_SECONDS
from training.__main__ import parse_args

PRE_RUNNING_SECONDS = PRE_RUNNING_FACTOR * SCALE_UP_MINUTES * 60
"""Seconds a RayJob may take to reach Running: a multiple of the scale-up + image-pull estimate."""
GPU_JOBS = ("smoke", "finetune-qwen")


def worker_group(cluster_spec):
    (group,) = cluster_spec["workerGroupSpecs"]
    return group


def container(template):
    (only,) = template["spec"]["containers"]
    return only


def env_of(c):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def set_args(entrypoint):
    argv = shlex.split(entrypoint)
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")


def entry_args(rayjob):
    """The RayJob's entrypoint as the job's own parser reads it (``python -m training``)."""
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "training"]
    return parse_args(argv[3:])


def submitted_config(rayjob):
    """The job config as the RayJob's entry point runs it: its file, the charts' --set and the
    spec's world size (a spec-sized job file alone may not validate)."""
    args = entry_args(rayjob)
    return load_job_config(args.config, args.overrides, args.world)


def test_raycluster_head_is_on_system_nodes_without_gpus(default_synth):
    env = default_synth.env
    rc = default_synth.one("raycluster")
    head = rc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["template"]["spec"]["nodeSelector"] == env.system_node_group.labels
    c = container(head["template"])
    assert env_of(c)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert GPU_RESOURCE not in c["resources"]["limits"]
    # the spec's head size: small enough for two heads, submitters and add-ons on one system node
    assert c["resources"]["limits"] == {"cpu": str(env.ray.head_cpu), "memory": f"{env.ray.head_memory_gib}Gi"}
    # the long-lived cluster scales its GPU workers (and so the GPU nodes) to zero when idle
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    assert rc["spec"]["autoscalerOptions"]["resources"]["requests"] == {"cpu": "200m", "memory": "512Mi"}


def test_raycluster_gpu_workers_follow_the_instance_type(default_synth):
    env = default_synth.env
    group = env.primary_gpu_group
    rc = default_synth.one("raycluster")
    wg = worker_group(rc["spec"])
    assert wg["groupName"] == group.name
    # none until a job asks; replicas is the autoscaler's (the CRD defaults it to 0), so a
    # re-apply with server-side apply never conflicts with it
    assert "replicas" not in wg and wg["minReplicas"] == 0
    assert wg["maxReplicas"] == group.job_nodes == 2
    c = container(wg["template"])
    limits = c["resources"]["limits"]
    assert c["resources"]["requests"] == limits  # Guaranteed QoS
    assert limits == {"cpu": "40", "memory": "160Gi", GPU_RESOURCE: "4", EFA_RESOURCE: "1"}
    assert wg["rayStartParams"]["num-gpus"] == limits[GPU_RESOURCE]
    pod = wg["template"]["spec"]
    assert pod["nodeSelector"][NODE_GROUP_LABEL] == group.name
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "g6.12xlarge"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true",
                                   "effect": "NoSchedule"}]
    assert pod["serviceAccountName"] == env.ray.service_account == "ray-train"


def test_efa_and_nccl_environment_on_gpu_workers(default_synth):
    wg = worker_group(default_synth.one("raycluster")["spec"])
    assert env_of(container(wg["template"])) == {
        "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi",
        # what run.json records about the cluster, and the region (no GetBucketLocation needed)
        "RAYTRAIN_CLUSTER": "raytrain", "RAYTRAIN_INSTANCE_TYPE": "g6.12xlarge", "RAYTRAIN_REGION": "us-east-1",
        # the L4's peak, MFU's denominator, from the environment package's GPU table
        "RAYTRAIN_PEAK_BF16_TFLOPS": "121",
        # the run's cost: the group's capacity type (its price is the job's: runtime env)
        "RAYTRAIN_CAPACITY_TYPE": "on-demand",
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        # where each rank ran: the node from the downward API, the zone from the spec
        "RAYTRAIN_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}}, "RAYTRAIN_AVAILABILITY_ZONE": "us-east-1a",
        # checkpoints are staged in an emptyDir: on the node's NVMe RAID0 (the kubelet's folder
        # is bind-mounted onto it), not the gp3 root
        "RAYTRAIN_CHECKPOINT_LOCAL_DIR": "/mnt/raytrain-local/checkpoints",
        # Ray's SIGTERM drain lasts the checkpoint grace (the long-lived cluster's)
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(LONG_LIVED_CHECKPOINT_GRACE_SECONDS)}
    [staging] = [v for v in wg["template"]["spec"]["volumes"] if v["name"] == "local-staging"]
    # 90 % of 4 x 940 GB, less the 40 GiB image on the same array
    assert staging == {"name": "local-staging", "emptyDir": {"sizeLimit": "3111Gi"}}
    assert {"name": staging["name"], "mountPath": "/mnt/raytrain-local"} in container(wg["template"])["volumeMounts"]


def test_gpudirect_rdma_is_set_only_where_the_instance_has_it():
    # p5 has GPUDirect RDMA over EFA; g6 (the default) does not and must not claim it.
    p5 = make_env(instance_type="p5.48xlarge")
    spec = ray_cluster_spec(ClusterShape(env=p5, worker_replicas=2, checkpoint_grace_seconds=60, cluster_label="c"))
    c = container(worker_group(spec)["template"])
    assert env_of(c)["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert c["resources"]["limits"][EFA_RESOURCE] == "32" and c["resources"]["limits"][GPU_RESOURCE] == "8"


def test_shm_is_a_memory_volume_on_every_pod(default_synth):
    spec = default_synth.one("raycluster")["spec"]
    for template in (spec["headGroupSpec"]["template"], worker_group(spec)["template"]):
        # sized to the container's memory limit (as KubeRay sizes its own, which it then skips)
        memory = container(template)["resources"]["limits"]["memory"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": memory}} in template["spec"]["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container(template)["volumeMounts"]


def test_image_ray_version_and_provenance(default_synth):
    env = default_synth.env
    rc = default_synth.one("raycluster")
    assert rc["spec"]["rayVersion"] == env.image.ray_version == "2.58.0"
    image = f"public.ecr.aws/deep-learning-containers/ray@{TEST_DIGEST}"
    spec = rc["spec"]
    assert {container(t)["image"] for t in (spec["headGroupSpec"]["template"], worker_group(spec)["template"])} == {image}
    assert rc["metadata"]["annotations"]["raytrain.io/image-digest"] == TEST_DIGEST
    assert rc["metadata"]["labels"]["raytrain.io/spec-hash"] == env.spec_hash
    assert rc["metadata"]["labels"]["raytrain.io/image-locked"] == "true"
    assert rc["metadata"]["name"] == "raytrain" and rc["metadata"]["namespace"] == "ray"


def test_an_unlocked_image_is_labelled_as_such(large_synth):
    rc = large_synth.one("raycluster")
    assert rc["metadata"]["annotations"]["raytrain.io/image-digest"] == "unlocked"
    assert rc["metadata"]["labels"]["raytrain.io/image-locked"] == "false"
    assert container(worker_group(rc["spec"])["template"])["image"].endswith(":train-ml-cuda-v1.1.0")


def test_rayjob_clusters_come_from_the_same_builder(default_synth):
    # The RayJob's cluster equals the RayCluster's except where the job differs: worker count,
    # grace period, the provenance on its pod templates, and the long-lived cluster's autoscaler and
    # upgrade strategy.
    rc = copy.deepcopy(default_synth.one("raycluster")["spec"])
    del rc["enableInTreeAutoscaling"], rc["autoscalerOptions"]
    head = rc["headGroupSpec"]["template"]["spec"]  # the autoscaler's token, for its container alone
    head["volumes"] = [v for v in head["volumes"] if v["name"] != "autoscaler-api-token"]
    rc.pop("upgradeStrategy", None)  # how the long-lived cluster takes a new pod template
    for t in (rc["headGroupSpec"]["template"], worker_group(rc)["template"]):
        t["spec"].pop("schedulingGates")  # Kueue's elastic-job gate: the long-lived cluster is queued by scale-up
    for job in GPU_JOBS:
        own = copy.deepcopy(default_synth.one(f"rayjob-{job}")["spec"]["rayClusterSpec"])
        for spec in (rc, own):
            worker_group(spec)["replicas"] = worker_group(spec)["minReplicas"] = worker_group(spec)["maxReplicas"] = 0
            worker_group(spec)["template"]["spec"]["terminationGracePeriodSeconds"] = 0
            spec["headGroupSpec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 0
            for e in container(worker_group(spec)["template"])["env"]:  # Ray's SIGTERM drain: the job's grace
                if e["name"] == "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S":
                    e["value"] = "0"
            for t in (spec["headGroupSpec"]["template"], worker_group(spec)["template"]):
                t["metadata"] = {}
        # each run's pods under a service account named after the run (the long-lived one: the spec's)
        for spec, account in ((rc, default_synth.env.ray.service_account), (own, job)):
            for t in (spec["headGroupSpec"]["template"], worker_group(spec)["template"]):
                assert t["spec"].get("serviceAccountName", account) == account
                t["spec"].pop("serviceAccountName", None)
        assert own == rc


def test_gpu_rayjob_world_size_and_storage_derive_from_the_spec(default_synth):
    env = default_synth.env
    for job in GPU_JOBS:
        rj = default_synth.one(f"rayjob-{job}")
        wg = worker_group(rj["spec"]["rayClusterSpec"])
        sets = set_args(rj["spec"]["entrypoint"])
        gpus = int(container(wg["template"])["resources"]["limits"][GPU_RESOURCE])
        world = entry_args(rj).world  # as data: typed arguments, not --set text
        assert world.num_workers == wg["replicas"] * gpus == env.world_size == 8
        assert world.workers_per_node == gpus == int(wg["rayStartParams"]["num-gpus"])
        assert not {"parallel.num_workers", "parallel.workers_per_node"} & set(sets)
        assert submitted_config(rj).parallel.use_gpu is True
        assert sets["checkpoint.storage_path"] == env.storage_uri == f"s3://raytrain-raytrain-{ACCOUNT}-us-east-1/runs"


def test_the_entrypoint_is_what_the_job_config_loader_accepts(default_synth):
    # The job parses its --set items with the same loader: the config it will run is valid.
    for job in ("smoke", "finetune-qwen", "local"):
        argv = shlex.split(default_synth.one(f"rayjob-{job}")["spec"]["entrypoint"])
        assert argv[:5] == ["python", "-m", "training", "--config", argv[4]] and argv[4].startswith("jobs/")
        cfg = submitted_config(default_synth.one(f"rayjob-{job}"))
        assert cfg.parallel.sized and cfg.name == job and cfg.checkpoint.storage_path == default_synth.env.storage_uri


def test_bucket_placeholders_are_filled_from_the_spec(default_synth):
    sets = set_args(default_synth.one("rayjob-finetune-qwen")["spec"]["entrypoint"])
    bucket = default_synth.env.bucket_name
    assert sets["model.path"] == f"s3://{bucket}/models/Qwen2.5-1.5B-Instruct"
    assert sets["data.path"] == f"s3://{bucket}/data/chat/"
    assert "{bucket}" not in yaml.safe_dump(default_synth.docs)


def test_local_job_keeps_its_own_cpu_workers(default_synth):
    rj = default_synth.one("rayjob-local")
    sets = set_args(rj["spec"]["entrypoint"])
    assert set(sets) == {"checkpoint.storage_path"}
    cfg = load_job_config("jobs/local.toml")
    assert (cfg.parallel.num_workers, cfg.parallel.use_gpu) == (2, False)
    wg = worker_group(rj["spec"]["rayClusterSpec"])
    assert wg["replicas"] == 1
    assert "rayjob-local-on-cluster" not in default_synth.docs  # CPU jobs have no GPU-cluster variant
    # sized to its CPUs (2 workers x 1 CPU), the node's memory per CPU (160 GiB / 40), no GPU,
    # no EFA, no NVMe staging; Ray is told of no GPU, and the NVIDIA runtime exposes none
    c = container(wg["template"])
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}
    assert wg["rayStartParams"]["num-gpus"] == "0"
    assert env_of(c)["NVIDIA_VISIBLE_DEVICES"] == "void" and "FI_PROVIDER" not in env_of(c)
    assert [v["name"] for v in wg["template"]["spec"]["volumes"]] == ["dshm"]


def test_large_spec_scales_world_size_and_workers(large_synth):
    for job in GPU_JOBS:
        rj = large_synth.one(f"rayjob-{job}")
        wg = worker_group(rj["spec"]["rayClusterSpec"])
        limits = container(wg["template"])["resources"]["limits"]
        assert (wg["replicas"], limits[GPU_RESOURCE], limits["cpu"], limits["memory"]) == (4, "8", "160", "640Gi")
        assert entry_args(rj).world.num_workers == 32
        assert wg["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == "g6.48xlarge"


def test_a_worker_pods_sigterm_drain_lasts_the_checkpoint_grace_inside_the_pod_grace(default_synth):
    # ray 2.58 _private/node.py _drain_node_before_shutdown: on SIGTERM `ray start` drains its node
    # (DrainNode, reason PREEMPTION) with deadline now + RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
    # (_private/ray_constants.py, default 30 s), then kills every process on the node at that
    # deadline, whatever the pod's terminationGracePeriodSeconds. That deadline is the notice
    # Ray Train's PreemptionWatcher sees: it must be the checkpoint grace, not Ray's 30 s.
    specs = [default_synth.one("raycluster")["spec"]] + [
        default_synth.one(f"rayjob-{job}")["spec"]["rayClusterSpec"] for job in GPU_JOBS + ("local",)]
    for spec in specs:
        pod = worker_group(spec)["template"]
        drain = int(env_of(container(pod))["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"])
        assert drain + STOP_MARGIN_SECONDS == pod["spec"]["terminationGracePeriodSeconds"]


def test_rayjob_lifecycle_fields(default_synth):
    for job in GPU_JOBS + ("local",):
        rj = default_synth.one(f"rayjob-{job}")
        cfg = submitted_config(rj)
        spec = rj["spec"]
        assert spec["submissionMode"] == "K8sJobMode"
        assert spec["shutdownAfterJobFinishes"] is True
        assert spec["ttlSecondsAfterFinished"] == cfg.rayjob.ttl_seconds_after_finished
        assert spec["backoffLimit"] == cfg.rayjob.backoff_limit
        assert spec["preRunningDeadlineSeconds"] == PRE_RUNNING_SECONDS
        assert spec["activeDeadlineSeconds"] == cfg.rayjob.active_deadline_minutes * 60 > 0
        grace = worker_group(spec["rayClusterSpec"])["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace == cfg.checkpoint.sigterm_grace_seconds + STOP_MARGIN_SECONDS
        # Ray's job supervisor waits as long as the workers (ray 2.58 job_supervisor.py reads
        # RAY_JOB_STOP_WAIT_TIME_S from the runtime env), and the head, where the driver runs,
        # outlives that wait when the RayJob's deletion takes its cluster down.
        stop_wait = int(yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"])
        assert stop_wait == grace
        head_grace = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert head_grace == stop_wait + STOP_MARGIN_SECONDS


def test_on_cluster_variant_targets_the_long_lived_cluster(default_synth):
    rc = default_synth.one("raycluster")
    for job in GPU_JOBS:
        variant = default_synth.one(f"rayjob-{job}-on-cluster")["spec"]
        own = default_synth.one(f"rayjob-{job}")["spec"]
        assert variant["clusterSelector"] == {"ray.io/cluster": rc["metadata"]["name"]}
        assert "rayClusterSpec" not in variant and "shutdownAfterJobFinishes" not in variant
        assert "ttlSecondsAfterFinished" not in variant  # KubeRay: only with shutdownAfterJobFinishes
        # KubeRay v1.7.0 utils/validation.go:575-576: backoffLimit > 0 with a clusterSelector is
        # ValidationFailed; the own-cluster variant keeps the job's retries.
        assert variant.get("backoffLimit", 0) == 0 and own["backoffLimit"] == submitted_config(default_synth.one(f"rayjob-{job}")).rayjob.backoff_limit
        # the same job, in the folder the long-lived cluster's role may write (run_folder)
        folder = run_folder(submitted_config(default_synth.one(f"rayjob-{job}")).run_name, on_cluster=True)
        assert variant["entrypoint"].replace(f" --set checkpoint.run_name={folder}", "", 1) == own["entrypoint"]
        assert f" --set checkpoint.run_name={folder} " in variant["entrypoint"]
        # the same runtime env, except each names its own manifest (and that file's hash) and
        # hashes its own config (the run folder differs: test_code_travels_as_working_dir_only)
        ours = [yaml.safe_load(v["runtimeEnvYAML"])["env_vars"] for v in (variant, own)]
        for env_vars in ours:
            del env_vars["RAYTRAIN_MANIFEST_NAME"], env_vars["RAYTRAIN_MANIFEST_HASH"], env_vars["RAYTRAIN_JOB_CONFIG_HASH"]
        assert ours[0] == ours[1]
    # The shared cluster's grace is fixed (not the longest of jobs/: adding a job must not
    # change its pod templates), and covers every job that may run on it.
    grace = worker_group(rc["spec"])["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == LONG_LIVED_CHECKPOINT_GRACE_SECONDS + STOP_MARGIN_SECONDS
    head_grace = rc["spec"]["headGroupSpec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert head_grace == grace + STOP_MARGIN_SECONDS
    for job in GPU_JOBS:
        assert submitted_config(default_synth.one(f"rayjob-{job}")).checkpoint.sigterm_grace_seconds \
            <= LONG_LIVED_CHECKPOINT_GRACE_SECONDS
        # KubeRay refuses backoffLimit with clusterSelector. The pre-running deadline bounds only the
        # long-lived head's readiness: its GPU workers scale up while the RayJob is Running
        variant = default_synth.one(f"rayjob-{job}-on-cluster")["spec"]
        assert "backoffLimit" not in variant and variant["preRunningDeadlineSeconds"] == PRE_RUNNING_SECONDS
        # the job's own stop wait, within what the long-lived head waits on deletion
        stop_wait = int(yaml.safe_load(variant["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"])
        assert stop_wait < head_grace


def test_code_travels_as_working_dir_only(default_synth):
    code = default_synth.result.code
    for chart, (obj, *_) in default_synth.docs.items():
        if obj["kind"] != "RayJob":
            continue
        runtime_env = yaml.safe_load(obj["spec"]["runtimeEnvYAML"])
        assert runtime_env["working_dir"] == f"s3://{default_synth.env.bucket_name}/code/{code.name}"
        assert set(runtime_env) == {"working_dir", "env_vars"}  # no pip, py_modules, conda
        assert runtime_env["env_vars"]["RAYTRAIN_CODE_HASH"] == code.content_hash
        labels = obj["metadata"]["labels"]
        assert labels["raytrain.io/code-hash"] == code.content_hash
        assert labels["raytrain.io/spec-hash"] == default_synth.env.spec_hash
        (plan,) = [p for p in default_synth.result.plans if p.name == labels["raytrain.io/job"]]
        want = plan.config_hash
        if "clusterSelector" in obj["spec"]:  # its run folder (charts/main.py) is part of the config it hashes
            config = plan.config.to_dict()
            config["checkpoint"] = {**config["checkpoint"], "run_name": run_folder(plan.config.run_name, on_cluster=True)}
            want = label_hash(job_config_hash(config))
        assert labels["raytrain.io/job-config-hash"] == want
        assert runtime_env["env_vars"]["RAYTRAIN_JOB_CONFIG_HASH"] == want
        assert code.name == f"training-{code.content_hash}.zip" and code.path.is_file()


def test_names_are_valid_kuberay_names(default_synth):
    import re

    for chart, (obj, *_) in default_synth.docs.items():
        if not obj["apiVersion"].startswith("ray.io/"):
            continue
        name = obj["metadata"]["name"]
        limit = 53 if obj["kind"] == "RayCluster" else 47
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= limit, name


@pytest.mark.subprocess  # synthesizes the charts through the cdk8s CLI
def test_a_spot_group_of_two_types_places_workers_on_either_and_tells_them_both_peaks():
    from charts.cluster_spec import gpu_peaks, node_placement, run_record_env

    env = make_env(capacity="spot", instance_types=["g5.12xlarge"])
    group = env.primary_gpu_group
    placed = node_placement(group)
    assert "node.kubernetes.io/instance-type" not in placed["nodeSelector"]
    [term] = placed["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                         "values": ["g6.12xlarge", "g5.12xlarge"]}]
    assert gpu_peaks(group) == "L4=121,A10G=70"
    pod_env = {e["name"]: e.get("value") for e in run_record_env(env, group, gpu_worker=True)}
    assert pod_env["RAYTRAIN_CAPACITY_TYPE"] == "spot" and "RAYTRAIN_PRICE_LABEL" not in pod_env
    assert pod_env["RAYTRAIN_INSTANCE_TYPE"] == "g6.12xlarge,g5.12xlarge"
    # the job takes its own GPU's peak from that list (training/metrics.py)
    from training.metrics import peak_tflops_from_env

    assert peak_tflops_from_env({"RAYTRAIN_PEAK_BF16_TFLOPS": "L4=121,A10G=70"}, "NVIDIA A10G") == 70.0
    assert peak_tflops_from_env({"RAYTRAIN_PEAK_BF16_TFLOPS": "L4=121,A10G=70"}, "NVIDIA L40S") is None


def test_the_node_price_travels_with_the_job_never_in_the_pod_template(default_synth):
    # a price edit must not change the RayCluster's pod template (KubeRay would recreate the
    # long-lived cluster on the hash change): the price is in each GPU RayJob's runtime env
    import yaml

    wg = worker_group(default_synth.one("raycluster")["spec"])
    assert "RAYTRAIN_NODE_PRICE_PER_HOUR" not in env_of(container(wg["template"]))
    gpu_jobs = [obj for chart, (obj, *_) in default_synth.docs.items()
                if obj["kind"] == "RayJob" and "RAYTRAIN_NODE_PRICE_PER_HOUR" in obj["spec"]["runtimeEnvYAML"]]
    assert gpu_jobs, "no GPU RayJob carries its node's price"
    env_vars = yaml.safe_load(gpu_jobs[0]["spec"]["runtimeEnvYAML"])["env_vars"]
    assert float(env_vars["RAYTRAIN_NODE_PRICE_PER_HOUR"]) > 0 and "estimate" in env_vars["RAYTRAIN_PRICE_LABEL"]
