"""Names shared by the CDK app, the manifests, the pipeline and the CLI: one definition each.

Standard library only. A label key, a taint, a resource name or a bucket prefix typed in two
packages drifts; imported from here it cannot.
"""
from __future__ import annotations

import re

# --- Kubernetes labels and taints of the node groups (set by infra, selected by charts) -----
NODE_GROUP_LABEL = "raytrain.io/node-group"
NODE_ROLE_LABEL = "raytrain.io/role"
EFA_LABEL = "raytrain.io/efa"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
GPU_TAINT_EFFECT = "NoSchedule"
# cluster-autoscaler's AWS provider tells a GPU node by this label (its presence; the value
# names the GPU): a node carrying it whose nvidia.com/gpu is not yet advertised counts as
# not ready instead of as "no GPU", so the autoscaler does not add nodes for the same pods again
# (kubernetes/autoscaler cluster-autoscaler/cloudprovider/aws/aws_cloud_provider.go GPULabel).
GPU_ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
GPU_ACCELERATOR_VALUES = {"L4": "nvidia-l4", "A10G": "nvidia-a10g", "A100": "nvidia-tesla-a100",
                          "H100": "nvidia-h100"}
"""GPU model -> the label value (the names of that file's availableGPUTypes where it has one)."""


def gpu_accelerator(gpu_model: str) -> str:
    return GPU_ACCELERATOR_VALUES.get(gpu_model, f"nvidia-{gpu_model.lower()}")


# The pod-side resource names the device plugins advertise.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

# --- GPU nodes' NVMe instance store (infra sets it up, charts mount it) --------------------
NVME_MOUNT = "/mnt/k8s-disks/0"
"""Where nodeadm's RAID0 local-storage strategy mounts the NVMe array (kubelet, containerd and pod
logs are bind-mounted below it)."""
EFA_MEMLOCK_BYTES = 9 * 10**18
"""RLIMIT_MEMLOCK of every container on an EFA node: far above any node's memory (x86-64
addresses at most 2^57 bytes), so in effect unlimited. Not RLIM_INFINITY (2^64-1): nodeadm
merges ``baseRuntimeSpec`` through ``map[string]interface{}`` (awslabs/amazon-eks-ami
``nodeadm/internal/util/merge.go``, Go's encoding/json), so every number passes through a
float64 and comes back as its shortest decimal; 2^64-1 would come back as 18446744073709552000,
which overflows the spec's uint64 and containerd could not load the runtime spec at all. This
value survives that round trip digit for digit."""
EFA_MEMLOCK_RLIMIT = {"type": "RLIMIT_MEMLOCK", "hard": EFA_MEMLOCK_BYTES, "soft": EFA_MEMLOCK_BYTES}
"""What the GPU nodes' containerd base runtime spec must give every container (nodeadm
NodeConfig ``spec.containerd.baseRuntimeSpec.process.rlimits``, see
``infra/constructs/node_groups.py``): libfabric's EFA provider pins the buffers it
registers with the NIC, up to RLIMIT_MEMLOCK. Set on the node, not as the pod capability
IPC_LOCK, which Pod Security's baseline level forbids."""

# --- the Ray namespace's Pod Security admission (infra labels it, charts' pods must pass) --
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/warn-version": "latest",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/audit-version": "latest",
}
"""Labels of the Ray namespace: the API server refuses a pod that fails ``baseline`` (host
paths, host namespaces, added capabilities, privileged); it warns on and audits what
``restricted`` would refuse (the DLC runs as root)."""

PART_OF = {"app.kubernetes.io/part-of": "raytrain-eks"}
"""The label of the Kubernetes objects this app creates on a cluster (the Ray namespace, its
policies, the Kueue queue objects): how `verify` tells them from a cluster's own objects."""

# --- provenance labels and annotations on every manifest (charts write, pipeline reads) -----
PROVENANCE_PREFIX = "raytrain.io"
SPEC_HASH_LABEL = f"{PROVENANCE_PREFIX}/spec-hash"
CODE_HASH_LABEL = f"{PROVENANCE_PREFIX}/code-hash"
JOB_CONFIG_HASH_LABEL = f"{PROVENANCE_PREFIX}/job-config-hash"
JOB_LABEL = f"{PROVENANCE_PREFIX}/job"
IMAGE_LOCKED_LABEL = f"{PROVENANCE_PREFIX}/image-locked"
GIT_COMMIT_LABEL = f"{PROVENANCE_PREFIX}/git-commit"
GIT_DIRTY_LABEL = f"{PROVENANCE_PREFIX}/git-dirty"
IMAGE_ANNOTATION = f"{PROVENANCE_PREFIX}/image"
IMAGE_DIGEST_ANNOTATION = f"{PROVENANCE_PREFIX}/image-digest"
CODE_URI_ANNOTATION = f"{PROVENANCE_PREFIX}/code"
JOB_CONFIG_ANNOTATION = f"{PROVENANCE_PREFIX}/job-config"
UNLOCKED = "unlocked"
"""The image-digest annotation of a manifest whose image is a moving tag."""
ON_CLUSTER_SUFFIX = "-on-cluster"
"""Appended to the run's name for the RayJob of a run on the long-lived RayCluster."""
ON_CLUSTER_FOLDER = "on-cluster_"
"""Prefixed to the run's name for its folder under the runs prefix when it runs on the long-lived
RayCluster (``runs/on-cluster_<run>/``). The long-lived cluster's role (single-team) reaches these
folders only; a run with its own cluster writes ``runs/<its service account>/``, and no service
account's name holds an underscore (a DNS subdomain), so no run's folder is ever one of these:
an ``-on-cluster`` job cannot touch another run's checkpoints, markers or DCP ``.metadata``."""


def run_folder(run: str, *, on_cluster: bool) -> str:
    """The run's folder under the runs prefix (:data:`ON_CLUSTER_FOLDER`)."""
    return f"{ON_CLUSTER_FOLDER}{run}" if on_cluster else run
RUN_TAG = "kubernetes-service-account"
"""The EKS Pod Identity session tag that names a run: each run's pods use a service account
named after the run, and EKS Pod Identity tags the role session with its name (Amazon EKS User
Guide, "Grant Pods access to AWS resources based on tags": eks-cluster-arn, eks-cluster-name,
kubernetes-namespace, kubernetes-service-account, kubernetes-pod-name, kubernetes-pod-uid)."""
INPUTS_PREFIX = "_inputs"
"""The folder of the runs' storage where ``submit`` uploads a job's local inputs (the job reads
it as ``training.contract.INPUTS_DIR``, which cannot import this layer: a test holds them equal)."""
PIPELINE_RUN_PREFIX = "smoke-"
"""Run names the pipeline's smoke runs take (raytrain_eks/pipeline/smoke.py): the evidence the
gate judges; the long-lived cluster's pods may not write them (docs/security.md)."""


SMOKE_SERVICE_ACCOUNT = "raytrain-smoke"
"""The service account of the pipeline's smoke runs (raytrain_eks/pipeline/smoke.py): associated
by the cluster stack with a role that writes ``<prefix>/smoke-*`` only, so the pipeline needs no
right to create associations."""
DEPLOYER_GROUP = "raytrain-pipeline-deployers"
"""The Kubernetes group of the pipeline's kubectl builds (their roles, access entries and rules:
infra/stacks/pipeline_access.py); the one group the run identity admission policy
(infra/constructs/pod_identity.py) lets name :data:`SMOKE_SERVICE_ACCOUNT`."""
SUBMITTERS_GROUP = "raytrain-submitters"
"""The Kubernetes group of the people who only submit (their EKS access entries name it:
infra/constructs/submitter_access.py)."""


def run_role_name(cluster_name: str) -> str:
    """The IAM role every run's own service account is associated with (one role, its grants
    made per run by the session tag :data:`RUN_TAG`); named, so ``submit`` can name it."""
    return f"{cluster_name}-ray-runs"[:64]

# --- the checkpoint bucket's layout (infra grants, charts and the demo upload) --------------
CODE_PREFIX = "code"
"""Key prefix of the content-addressed code archives every RayJob names as its working_dir;
the pod role must be able to read it."""
REGRESSION_REPORT_DIR = "regression"
"""Folder inside a smoke run's directory where the pipeline's regression gate writes the
side-by-side report against the last promoted smoke run (the pipeline role may write there)."""

# --- image digests (spec validation, lock, the image watcher) -------------------------------
DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")

# --- Ray pods as Prometheus targets (the add-on table scrapes them; network policies admit it) --
RAY_METRICS_PORT = 8080
"""Port of Ray's metrics agent in every Ray pod: KubeRay v1.7.0 passes
``--metrics-export-port=8080`` and adds a container port named :data:`RAY_METRICS_PORT_NAME`
to the head and every worker (ray-operator/controllers/ray/common/pod.go). The manifests do
not declare it themselves: a head container that declares ANY port loses KubeRay's default head
Service ports (GCS, dashboard, client; common/service.go getServicePorts)."""
RAY_METRICS_PORT_NAME = "metrics"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
"""KubeRay's pod label: ``head`` or ``worker``."""
RAY_CLUSTER_LABEL = "ray.io/cluster"
"""KubeRay's pod label: the RayCluster's name."""

# --- Ray pods inside the cluster (charts label them, the network policies select them) ------
RAY_PEER_LABEL = f"{PROVENANCE_PREFIX}/ray-cluster"
"""On every pod of one Ray cluster (head, workers) AND on the submitter that talks to it: the
network policy of that cluster admits exactly the pods carrying its value. KubeRay's own
:data:`RAY_CLUSTER_LABEL` cannot serve: a RayJob's cluster name gets a random suffix at run
time, and the submitter does not carry it."""
RAY_DASHBOARD_PORT = 8265
"""The Ray dashboard: the job-submission API the submitter and the KubeRay operator call."""

# --- Kubernetes versions the CDK app can build (infra/build.py KUBECTL_LAYERS) --------------
KUBERNETES_VERSIONS: tuple[str, ...] = ("1.36",)
"""Minor versions with a kubectl/helm Lambda layer in this CDK app: the provider's client must
match the server's minor. Each needs the PyPI package ``aws-cdk.lambda-layer-kubectl-v1NN``
pinned in pyproject.toml; infra/build.py (KUBECTL_LAYERS) derives the module from the version."""

# --- what the pipeline adds to a smoke run's run.json ---------------------------------------
RECORD_IMAGE_RAN = "image_ran"
RECORD_EVIDENCE = "evidence_versions"
"""run.json key the pipeline's Smoke step writes: ``{file name: S3 VersionId}`` of the records the
gate judges, pinned when the smoke run ended (raytrain_eks/pipeline/smoke.py ``pin_evidence``)."""
"""run.json key the pipeline writes after a smoke run: ``{"pods": {pod: imageID}, "source": ...}``
from the pods' ``status.containerStatuses[].imageID`` (what the runtime pulled). A container
cannot read its own imageID (the downward API has no such field), so the job records only the
image the manifest ASKED for (``image``); promotion compares this one."""


# --- the CloudFormation stacks of an environment (the CDK app names them, the CLI reads them) ---
def stack_name(cluster_name: str, part: str) -> str:
    """``raytrain`` + ``cluster`` -> ``raytrain-cluster`` (parts: network, storage, cluster, pipeline)."""
    return f"{cluster_name}-{part}"


def control_plane_log_group(cluster_name: str) -> str:
    """Where EKS writes a cluster's control-plane logs (the cluster stack creates it, with a retention)."""
    return f"/aws/eks/{cluster_name}/cluster"
