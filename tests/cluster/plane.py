"""A real Kubernetes control plane on 127.0.0.1 for the ``cluster`` tier (docs/testing.md).

The processes a managed cluster runs, built from source by scripts/build-control-plane.sh
(versions pinned there, binaries under ``.work/cluster-bin/<name>-<version>/``): etcd,
kube-apiserver, kube-controller-manager and kube-scheduler of Kubernetes v1.36 (the spec's
``kubernetes_version``), KWOK's controller standing in for the kubelets of fake nodes shaped like
the spec's node groups (its stages move pods to Running; nothing runs in them), and the KubeRay
operator and Kueue as host processes with a kubeconfig (they need no kubelet). Kueue's webhooks
are served from this host with a certificate of the plane's own CA; its webhook configurations
are the ones its chart installs, pointed at that address instead of an in-cluster Service.

What the stacks install comes from where the stacks take it: the KubeRay CRDs of
``charts/crds/`` (the add-on's pinned CRD file), Kueue's CRDs of the built version, Kueue's
manager configuration from :func:`environment.queueing.kueue_values` and its queue objects from
:func:`environment.queueing.kueue_objects`.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spec_template import template_raw

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-control-plane.sh"
BIN = ROOT / ".work" / "cluster-bin"
KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
"""The annotation by which the kwok controller takes a node over (``--manage-nodes-with-annotation-selector``)."""
START_TIMEOUT_S = 300
"""How long one component may take to answer (a loaded 2-core machine starts the apiserver in ~20 s)."""


class PlaneError(RuntimeError):
    """The plane could not be built or started; the message names the part and its log."""


def versions() -> dict[str, str]:
    """name -> version, as pinned in the build script (one definition)."""
    text = BUILD_SCRIPT.read_text()
    found = dict(re.findall(r"^(\w+)_VERSION=(?:\$\{\w+:-)?(v[0-9][^}\s]*)", text, re.M))
    return {"etcd": found["ETCD"], "kubernetes": found["K8S"], "kwok": found["KWOK"],
            "kuberay": found["KUBERAY"], "kueue": found["KUEUE"]}


def binary(part: str, name: str) -> Path:
    path = BIN / f"{part}-{versions()[part]}" / name
    if not path.is_file():
        raise PlaneError(f"{path} is missing: build the control plane first (bash {BUILD_SCRIPT.relative_to(ROOT)}, "
                         "or make cluster-plane; ~25-40 min cold on 2 cores)")
    return path


def spec_raw(namespace: str = "ray", prefix: str = "") -> dict:
    """The template spec with the Ray namespace (and the cluster-wide queue objects' prefix) of one test."""
    raw = template_raw()
    raw["ray"]["namespace"] = namespace
    raw["queueing"]["name_prefix"] = prefix
    return raw


def spec(namespace: str = "ray", prefix: str = ""):
    from environment.model import environment_from_dict

    return environment_from_dict(spec_raw(namespace, prefix), str(ROOT / "environment.toml"))


# --- certificates --------------------------------------------------------------------------------

def _certificates(out: Path) -> None:
    """A CA; the serving certificate of the apiserver and the webhooks (127.0.0.1); the admin's
    client certificate (group system:masters); the service-account signing key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raytrain-plane-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (out / "ca.key").write_bytes(key_pem(ca_key))

    def leaf(name: str, subject: list, *, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(x509.Name(subject)).issuer_name(ca_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2)))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
                 x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default.svc")]),
                critical=False)
            usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
        else:
            usage = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        cert = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False).sign(ca_key, hashes.SHA256())
        (out / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (out / f"{name}.key").write_bytes(key_pem(key))

    leaf("serving", [x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")], server=True)
    leaf("admin", [x509.NameAttribute(NameOID.COMMON_NAME, "plane-admin"),
                   x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")], server=False)
    sa_key = ec.generate_private_key(ec.SECP256R1())
    (out / "sa.key").write_bytes(key_pem(sa_key))
    (out / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    # controller-runtime's webhook server reads tls.crt / tls.key from its certDir.
    webhook = out / "webhook-certs"
    webhook.mkdir()
    shutil.copy(out / "serving.crt", webhook / "tls.crt")
    shutil.copy(out / "serving.key", webhook / "tls.key")


# --- the plane -----------------------------------------------------------------------------------

@dataclass
class Plane:
    """The running plane: its kubeconfig, kubectl and the processes (name -> Popen)."""

    workdir: Path
    cluster_name: str
    kubeconfig: Path = field(init=False)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    started_s: dict[str, float] = field(default_factory=dict)
    """Seconds each component took to answer (printed by bench/bench_cluster_plane.py)."""

    def __post_init__(self) -> None:
        self.kubeconfig = self.workdir / "kubeconfig"

    @property
    def kubectl_path(self) -> Path:
        return binary("kubernetes", "kubectl")

    @property
    def bin_dir(self) -> Path:
        """The directory holding the built kubectl (first on a test's PATH)."""
        return self.kubectl_path.parent

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args], text=True,
                              capture_output=True, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise PlaneError(f"kubectl {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply_objects(self, objects: list[dict[str, Any]], *, server_side: bool = True) -> subprocess.CompletedProcess:
        text = yaml.safe_dump_all(objects, sort_keys=False)
        flags = ["--server-side", "--force-conflicts"] if server_side else []
        return self.kubectl("apply", *flags, "-f", "-", input=text)

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, ready, what: str) -> None:
        started = time.monotonic()
        deadline = started + START_TIMEOUT_S
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise PlaneError(f"{name} exited {proc.returncode} before {what}: {self.tail(name)}")
            if ready():
                self.started_s[name] = time.monotonic() - started
                return
            time.sleep(0.25)
        raise PlaneError(f"{name}: no {what} within {START_TIMEOUT_S} s: {self.tail(name)}")

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
        return f"({path}) " + " | ".join(text)

    def _raw_ok(self, path: str) -> bool:
        """One readiness probe; a probe that does not answer in time is "not yet" (the start's
        own bound decides), never an error that ends the start."""
        try:
            return self.kubectl("get", "--raw", path, check=False, timeout=20).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        """Each process in the reverse order of its start, one at a time: an apiserver whose etcd
        is already gone waits on it instead of exiting."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    # --- start, in dependency order ---------------------------------------------------------------

    def start(self, env, *, controllers: bool = True) -> None:
        """etcd, the apiserver, controller-manager, scheduler; the namespaces, CRDs and nodes of
        ``env``; kwok; the KubeRay operator; Kueue, its webhooks and its queue objects.
        ``controllers=False``: etcd, the apiserver and what it holds (namespaces, CRDs, nodes)
        only, for tests of admission alone (no object needs a controller to act on it)."""
        from raytrain_eks.backends.local_services import free_port

        w = self.workdir
        _certificates(w)
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok",
                     "kuberay-metrics", "kuberay-probe", "kueue-webhook", "kueue-probe"):
            self.ports[name] = free_port()
        p = self.ports
        etcd = f"http://127.0.0.1:{p['etcd']}"
        self._start("etcd", [str(binary("etcd", "etcd")), "--name", "plane", "--data-dir", str(w / "etcd"),
                             "--listen-client-urls", etcd, "--advertise-client-urls", etcd,
                             "--listen-peer-urls", f"http://127.0.0.1:{p['etcd-peer']}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{p['etcd-peer']}",
                             "--initial-cluster", f"plane=http://127.0.0.1:{p['etcd-peer']}",
                             "--unsafe-no-fsync", "--log-level", "warn"])
        self._write_kubeconfig()
        self._start("kube-apiserver", [
            str(binary("kubernetes", "kube-apiserver")), f"--etcd-servers={etcd}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={p['apiserver']}",
            f"--cert-dir={w / 'apiserver-certs'}", f"--tls-cert-file={w / 'serving.crt'}",
            f"--tls-private-key-file={w / 'serving.key'}", f"--client-ca-file={w / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={w / 'sa.pub'}", f"--service-account-signing-key-file={w / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=0"])
        self._wait("kube-apiserver", lambda: self._raw_ok("/readyz"), "/readyz")
        if not controllers:
            self._install(env)
            return
        common = [f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
                  f"--authorization-kubeconfig={self.kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1"]
        self._start("kube-controller-manager", [
            str(binary("kubernetes", "kube-controller-manager")), *common, f"--secure-port={p['controller-manager']}",
            f"--service-account-private-key-file={w / 'sa.key'}", f"--root-ca-file={w / 'ca.crt'}",
            f"--cluster-signing-cert-file={w / 'ca.crt'}", f"--cluster-signing-key-file={w / 'ca.key'}",
            "--use-service-account-credentials=false", "--controllers=*"])
        self._start("kube-scheduler", [str(binary("kubernetes", "kube-scheduler")), *common,
                                       f"--secure-port={p['scheduler']}"])
        # The default service account appears once the controller-manager runs (pods need it).
        self._wait("kube-controller-manager",
                   lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
                   "default service account")
        self._install(env)
        self._start("kwok", [str(binary("kwok", "kwok")), f"--kubeconfig={self.kubeconfig}",
                             "--config", str(self._stages()), "--manage-all-nodes=false",
                             "--manage-nodes-with-annotation-selector=" + ",".join(f"{k}={v}" for k, v in KWOK_ANNOTATION.items()),
                             f"--server-address=127.0.0.1:{p['kwok']}", "--cidr=10.244.0.0/16", "--node-ip=127.0.0.1"])
        self._wait("kwok", self._nodes_ready, "Ready nodes")
        self._start("kuberay-operator", [
            str(binary("kuberay", "kuberay-operator")), f"--metrics-addr=127.0.0.1:{p['kuberay-metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{p['kuberay-probe']}", "--enable-leader-election=false"],
            env={"KUBECONFIG": str(self.kubeconfig)})
        self._wait("kuberay-operator", lambda: _http_ok(f"http://127.0.0.1:{p['kuberay-probe']}/readyz"), "/readyz")
        self._start_kueue(env)

    def _stages(self) -> Path:
        """KWOK's stages without ``pod-complete`` (which moves every Running pod a Job owns to
        Succeeded at once). On EKS a RayJob's submitter pod runs ``ray job submit`` and follows
        the job until it ends; completed at once, it would make KubeRay v1.6.2 fail the RayJob 30 s
        later ("The RayJob submitter finished at ... but the ray job did not reach terminal state",
        rayjob_controller.go ``checkSubmitterFinishedTimeoutAndUpdateStatusIfNeeded``) and delete
        its cluster: nothing that outlives 30 s could be observed."""
        docs = [d for d in yaml.safe_load_all(binary("kwok", "stages.yaml").read_text())
                if d and d["metadata"]["name"] != "pod-complete"]
        path = self.workdir / "stages.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return path

    def _write_kubeconfig(self) -> None:
        w = self.workdir
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "plane",
                  "clusters": [{"name": self.cluster_name, "cluster": {
                      "server": f"https://127.0.0.1:{self.ports['apiserver']}", "certificate-authority": str(w / "ca.crt")}}],
                  "users": [{"name": "plane-admin", "user": {"client-certificate": str(w / "admin.crt"),
                                                             "client-key": str(w / "admin.key")}}],
                  "contexts": [{"name": "plane", "context": {"cluster": self.cluster_name, "user": "plane-admin"}}]}
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def _install(self, env) -> None:
        """What the cluster stack creates before any job: the add-ons' namespaces, the Ray
        namespace and its service account, the KubeRay CRDs of the add-on's pinned file, Kueue's
        CRDs, and one KWOK node per node of every group at its maximum size."""
        from environment.addons import ADDONS

        kuberay = next(a for a in ADDONS if a.key == "kuberay_operator")
        crd_file = kuberay.crds(env.versions.chart("kuberay_operator"))
        namespaces = ["kuberay-system", "kueue-system", env.ray.namespace]
        self.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces])
        self.kubectl("apply", "--server-side", "-f", str(crd_file))
        # RayService, which the operator watches and the stack's CRD file does not hold (the
        # operator's Helm chart installs it on EKS; scripts/build-control-plane.sh stage_kuberay).
        self.kubectl("apply", "--server-side", "-f", str(binary("kuberay", "crds-extra.yaml")))
        self.kubectl("apply", "--server-side", "-f", str(binary("kueue", "crds.yaml")))
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
        self.apply_objects(nodes(env))

    def _nodes_ready(self) -> bool:
        items = self.get("nodes")["items"]
        return bool(items) and all(any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in (n.get("status") or {}).get("conditions") or []) for n in items)

    def _start_kueue(self, env) -> None:
        from environment.queueing import kueue_values

        p, w = self.ports, self.workdir
        # The stacks' manager configuration (the chart's controllerManagerConfigYaml), with what a
        # host process needs instead of a pod's: its own addresses, the plane's certificate.
        config = json.loads(kueue_values(env, env.versions.chart("kueue"), {})["managerConfig"]["controllerManagerConfigYaml"])
        config.update({"kind": "Configuration", "namespace": "kueue-system",
                       "health": {"healthProbeBindAddress": f"127.0.0.1:{p['kueue-probe']}"},
                       "metrics": {"bindAddress": "0"},
                       "webhook": {"port": p["kueue-webhook"], "host": "127.0.0.1", "certDir": str(w / "webhook-certs")},
                       "leaderElection": {"leaderElect": False},
                       "internalCertManagement": {"enable": False}})
        (w / "kueue-config.yaml").write_text(yaml.safe_dump(config))
        # Kueue v0.19.2 reads its metrics certificate from a fixed path whenever its internal
        # certificate management is off (cmd/kueue/main.go:215-229, "/etc/kueue/metrics/certs"),
        # even with metrics disabled, and exits without it: the plane's serving certificate.
        metrics = Path("/etc/kueue/metrics/certs")
        try:
            metrics.mkdir(parents=True, exist_ok=True)
            shutil.copy(w / "serving.crt", metrics / "tls.crt")
            shutil.copy(w / "serving.key", metrics / "tls.key")
        except OSError as err:
            raise PlaneError(f"kueue needs its metrics certificate in {metrics} (a path fixed in Kueue v0.19.2 "
                             f"cmd/kueue/main.go:217) and it cannot be written here: {err}") from err
        # Its visibility API server (VisibilityOnDemand) reads a certificate at the fixed
        # /visibility/tls.crt and Kueue exits without it; the CLI reads Workloads, not that API.
        self._start("kueue", [str(binary("kueue", "kueue")), f"--config={w / 'kueue-config.yaml'}",
                              "--feature-gates=VisibilityOnDemand=false"],
                    env={"KUBECONFIG": str(self.kubeconfig)})
        self._wait("kueue", lambda: _http_ok(f"http://127.0.0.1:{p['kueue-probe']}/readyz"), "/readyz")
        self.apply_objects(kueue_webhooks(binary("kueue", "webhooks.yaml"), f"https://127.0.0.1:{p['kueue-webhook']}",
                                          (w / "ca.crt").read_bytes()))
        # The priority classes are cluster-wide and the same for every test's queue.
        from environment.queueing import kueue_objects

        priorities = yaml.safe_dump_all([o for o in kueue_objects(env) if o["kind"] == "WorkloadPriorityClass"])
        self._wait("kueue", lambda: self.kubectl("apply", "--server-side", "-f", "-", input=priorities,
                                                 check=False).returncode == 0, "its webhooks answering")


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def kueue_webhooks(manifest: Path, base_url: str, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations as its chart installs them, each webhook sent to
    ``base_url`` + its path instead of the in-cluster Service, trusting the plane's CA."""
    import base64

    out = []
    for doc in yaml.safe_load_all(manifest.read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        for hook in doc.get("webhooks", []):
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": base64.b64encode(ca).decode()}
        out.append(doc)
    return out


def nodes(env) -> list[dict[str, Any]]:
    """One KWOK node per node of every group, at ``max_nodes`` (the size cluster-autoscaler can
    reach): the labels and taints EKS gives the group's nodes (infra/constructs/node_groups.py:
    the group's labels and the accelerator label), the instance type, zone and capacity type, and
    the allocatable of :func:`raytrain_eks.planning.fit.allocatable` (the fit check's own figures)."""
    from environment.contract import GPU_ACCELERATOR_LABEL, gpu_accelerator
    from raytrain_eks.planning.fit import allocatable

    def node(name: str, instance_type: str, labels: dict, taints: list, zone: str, capacity: str) -> dict[str, Any]:
        alloc = {k: (f"{int(v * 1000)}m" if k == "cpu" else str(int(v))) for k, v in allocatable(instance_type).items()}
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": dict(KWOK_ANNOTATION), "labels": {
                    **labels, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": instance_type, "topology.kubernetes.io/zone": zone,
                    "eks.amazonaws.com/capacityType": capacity, "type": "kwok"}},
                "spec": {"taints": taints},
                "status": {"allocatable": alloc, "capacity": alloc}}

    out = []
    system = env.system_node_group
    for i in range(system.nodes):
        out.append(node(f"system-{i}", system.instance_type, dict(system.labels), [],
                        env.cluster.availability_zones[i % len(env.cluster.availability_zones)], "ON_DEMAND"))
    for group in env.gpu_node_groups:
        labels = {**group.labels, GPU_ACCELERATOR_LABEL: gpu_accelerator(group.instance.gpu_model)}
        capacity = "CAPACITY_BLOCK" if group.capacity == "capacity-block" else "ON_DEMAND"
        for i in range(group.max_nodes):
            out.append(node(f"{group.name}-{i}", group.instance_type, labels, [dict(t) for t in group.taints],
                            env.cluster.gpu_availability_zone, capacity))
    return out
