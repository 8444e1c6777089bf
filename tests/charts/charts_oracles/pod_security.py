"""The Pod Security admission levels ``baseline`` and ``restricted`` over one pod.

Port of ``kubernetes/pod-security-admission`` tag ``v0.36.2`` (the staging copy of
``kubernetes/kubernetes`` ``staging/src/k8s.io/pod-security-admission``, Kubernetes 1.36),
``policy/check_*.go``, each at its newest version (what ``enforce-version: latest`` on a 1.36
API server runs). ``visitContainers`` (``policy/visitor.go``) visits init, regular and ephemeral
containers. A restricted check that "overrides" a baseline one replaces it at restricted
(``OverrideCheckIDs``): restrictedVolumes replaces hostPathVolumes, capabilities_restricted
replaces capabilities_baseline, seccompProfile_restricted replaces seccompProfile_baseline,
procMount_restricted replaces procMount.

Each check returns None (allowed) or ``"<check id>: <forbidden detail>"``.
"""
from __future__ import annotations

from typing import Callable

Pod = dict  # {"metadata": ..., "spec": ...}


def _containers(spec: dict):
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(container: dict) -> dict:
    return container.get("securityContext") or {}


def _user_namespace(spec: dict) -> bool:
    """relaxPolicyForUserNamespacePod (policy/helpers.go): ``hostUsers: false``, 1.35+."""
    return spec.get("hostUsers") is False


# --- baseline ------------------------------------------------------------------------------
def host_namespaces(pod: Pod) -> str | None:
    bad = [k for k in ("hostNetwork", "hostPID", "hostIPC") if pod["spec"].get(k) is True]
    return f"hostNamespaces: {', '.join(f'{k}=true' for k in bad)}" if bad else None


def privileged(pod: Pod) -> str | None:
    bad = [c["name"] for c in _containers(pod["spec"]) if _sc(c).get("privileged") is True]
    return f"privileged: containers {bad} must not set securityContext.privileged=true" if bad else None


CAPABILITIES_BASELINE = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def capabilities_baseline(pod: Pod) -> str | None:
    bad = {c["name"]: sorted(set((_sc(c).get("capabilities") or {}).get("add") or []) - CAPABILITIES_BASELINE)
           for c in _containers(pod["spec"])}
    bad = {k: v for k, v in bad.items() if v}
    return (f"capabilities_baseline: containers {sorted(bad)} must not include "
            f"{sorted({x for v in bad.values() for x in v})} in securityContext.capabilities.add") if bad else None


def host_path_volumes(pod: Pod) -> str | None:
    bad = [v["name"] for v in pod["spec"].get("volumes") or [] if "hostPath" in v]
    return f"hostPathVolumes: hostPath volumes {bad}" if bad else None


def host_ports(pod: Pod) -> str | None:
    bad = [c["name"] for c in _containers(pod["spec"]) for p in c.get("ports") or [] if p.get("hostPort")]
    return f"hostPorts: containers {bad} use hostPort" if bad else None


APPARMOR_TYPES = {"RuntimeDefault", "Localhost"}


def app_armor_profile(pod: Pod) -> str | None:
    """check_appArmorProfile.go: a type other than RuntimeDefault/Localhost, or a beta annotation
    other than empty, ``runtime/default`` or ``localhost/...``."""
    spec, bad = pod["spec"], []
    pod_profile = (spec.get("securityContext") or {}).get("appArmorProfile")
    if pod_profile and pod_profile.get("type") not in APPARMOR_TYPES:
        bad.append("pod")
    bad += [c["name"] for c in _containers(spec)
            if _sc(c).get("appArmorProfile") and _sc(c)["appArmorProfile"].get("type") not in APPARMOR_TYPES]
    for key, value in (pod.get("metadata", {}).get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "" or value == "runtime/default" or value.startswith("localhost/")):
            bad.append(key)
    return f"appArmorProfile: {bad} set a forbidden AppArmor profile" if bad else None


SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def se_linux_options(pod: Pod) -> str | None:
    spec = pod["spec"]
    options = [("pod", (spec.get("securityContext") or {}).get("seLinuxOptions"))]
    options += [(c["name"], _sc(c).get("seLinuxOptions")) for c in _containers(spec)]
    bad = [who for who, o in options if o and (o.get("type", "") not in SELINUX_TYPES or o.get("user") or o.get("role"))]
    return f"seLinuxOptions: {bad} set forbidden SELinux options" if bad else None


def _proc_mount_1_0(pod: Pod) -> list[str]:
    return [c["name"] for c in _containers(pod["spec"]) if _sc(c).get("procMount", "Default") != "Default"]


def proc_mount(pod: Pod) -> str | None:
    """check_procMount_baseline.go (1.35: relaxed for a user-namespace pod)."""
    if _user_namespace(pod["spec"]):
        return None
    bad = _proc_mount_1_0(pod)
    return f"procMount: containers {bad} must not set securityContext.procMount" if bad else None


def proc_mount_restricted(pod: Pod) -> str | None:
    """check_procMount_restricted.go (1.35+, overrides ``procMount``): no user-namespace relaxation."""
    bad = _proc_mount_1_0(pod)
    return f"procMount_restricted: containers {bad} must not set securityContext.procMount" if bad else None


def seccomp_baseline(pod: Pod) -> str | None:
    spec = pod["spec"]
    valid = {"RuntimeDefault", "Localhost"}  # validSeccomp
    pod_profile = (spec.get("securityContext") or {}).get("seccompProfile")
    bad = ["pod"] if pod_profile and pod_profile.get("type") not in valid else []
    bad += [c["name"] for c in _containers(spec)
            if _sc(c).get("seccompProfile") and _sc(c)["seccompProfile"].get("type") not in valid]
    return f"seccompProfile_baseline: {bad} must not set securityContext.seccompProfile.type to Unconfined" if bad else None


SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}  # sysctlsV1Dot32


def sysctls(pod: Pod) -> str | None:
    bad = [s["name"] for s in (pod["spec"].get("securityContext") or {}).get("sysctls") or []
           if s["name"] not in SAFE_SYSCTLS]
    return f"sysctls: forbidden sysctls {bad}" if bad else None


def windows_host_process(pod: Pod) -> str | None:
    spec = pod["spec"]
    options = [((spec.get("securityContext") or {}).get("windowsOptions") or {})]
    options += [(_sc(c).get("windowsOptions") or {}) for c in _containers(spec)]
    return "windowsHostProcess: hostProcess=true" if any(o.get("hostProcess") is True for o in options) else None


def host_probes_and_lifecycle(pod: Pod) -> str | None:
    bad = []
    for c in _containers(pod["spec"]):
        handlers = [c.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(c.get("lifecycle") or {}).get(h) for h in ("postStart", "preStop")]
        if any(h and ((h.get("httpGet") or {}).get("host") or (h.get("tcpSocket") or {}).get("host")) for h in handlers):
            bad.append(c["name"])
    return f"hostProbesAndHostLifecycle: containers {bad} set a probe or lifecycle host" if bad else None


# --- restricted ----------------------------------------------------------------------------
ALLOWED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                        "persistentVolumeClaim", "projected", "secret"}


def restricted_volumes(pod: Pod) -> str | None:
    bad = {v["name"]: sorted(set(v) - {"name"}) for v in pod["spec"].get("volumes") or []
           if not (set(v) - {"name"}) & ALLOWED_VOLUME_TYPES}
    return f"restrictedVolumes: volumes {bad} use restricted volume types" if bad else None


def allow_privilege_escalation(pod: Pod) -> str | None:
    if (pod["spec"].get("os") or {}).get("name") == "windows":
        return None
    bad = [c["name"] for c in _containers(pod["spec"]) if _sc(c).get("allowPrivilegeEscalation") is not False]
    return f"allowPrivilegeEscalation: containers {bad} must set securityContext.allowPrivilegeEscalation=false" if bad else None


def run_as_non_root(pod: Pod) -> str | None:
    spec = pod["spec"]
    if _user_namespace(spec):
        return None
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    explicit = [c["name"] for c in _containers(spec) if _sc(c).get("runAsNonRoot") is False]
    if pod_value is False or explicit:
        return f"runAsNonRoot: {['pod'] if pod_value is False else []}{explicit} must not set securityContext.runAsNonRoot=false"
    implicit = [c["name"] for c in _containers(spec) if "runAsNonRoot" not in _sc(c) and pod_value is not True]
    return f"runAsNonRoot: pod or containers {implicit} must set securityContext.runAsNonRoot=true" if implicit else None


def run_as_user(pod: Pod) -> str | None:
    spec = pod["spec"]
    if _user_namespace(spec):
        return None
    bad = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    bad += [c["name"] for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    return f"runAsUser: {bad} must not set runAsUser=0" if bad else None


def seccomp_restricted(pod: Pod) -> str | None:
    spec = pod["spec"]
    if (spec.get("os") or {}).get("name") == "windows":
        return None
    valid = {"RuntimeDefault", "Localhost"}
    pod_type = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    bad = ["pod"] if pod_type is not None and pod_type not in valid else []
    implicit = []
    for c in _containers(spec):
        kind = (_sc(c).get("seccompProfile") or {}).get("type")
        if kind is not None and kind not in valid:
            bad.append(c["name"])
        elif kind is None and pod_type not in valid:
            implicit.append(c["name"])
    if bad:
        return f"seccompProfile_restricted: {bad} must not set securityContext.seccompProfile.type to an unconfined profile"
    return (f"seccompProfile_restricted: pod or containers {implicit} must set securityContext.seccompProfile.type "
            "to \"RuntimeDefault\" or \"Localhost\"") if implicit else None


def capabilities_restricted(pod: Pod) -> str | None:
    if (pod["spec"].get("os") or {}).get("name") == "windows":
        return None
    missing, adding = [], {}
    for c in _containers(pod["spec"]):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            missing.append(c["name"])
        extra = sorted(set(caps.get("add") or []) - {"NET_BIND_SERVICE"})
        if extra:
            adding[c["name"]] = extra
    details = []
    if missing:
        details.append(f'containers {missing} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"containers {sorted(adding)} must not include {sorted({x for v in adding.values() for x in v})} "
                       "in securityContext.capabilities.add")
    return f"capabilities_restricted: {'; '.join(details)}" if details else None


BASELINE: dict[str, Callable[[Pod], str | None]] = {
    "hostNamespaces": host_namespaces, "privileged": privileged, "capabilities_baseline": capabilities_baseline,
    "hostPathVolumes": host_path_volumes, "hostPorts": host_ports, "appArmorProfile": app_armor_profile,
    "seLinuxOptions": se_linux_options, "procMount": proc_mount, "seccompProfile_baseline": seccomp_baseline,
    "sysctls": sysctls, "windowsHostProcess": windows_host_process,
    "hostProbesAndHostLifecycle": host_probes_and_lifecycle,
}
RESTRICTED: dict[str, Callable[[Pod], str | None]] = {
    "restrictedVolumes": restricted_volumes, "allowPrivilegeEscalation": allow_privilege_escalation,
    "runAsNonRoot": run_as_non_root, "runAsUser": run_as_user, "seccompProfile_restricted": seccomp_restricted,
    "capabilities_restricted": capabilities_restricted, "procMount_restricted": proc_mount_restricted,
}
OVERRIDES = {"restrictedVolumes": "hostPathVolumes", "capabilities_restricted": "capabilities_baseline",
             "seccompProfile_restricted": "seccompProfile_baseline", "procMount_restricted": "procMount"}


def violations(pod: Pod, level: str) -> list[str]:
    """Every failed check of ``level`` (``baseline`` or ``restricted``) on ``pod``."""
    checks = dict(BASELINE)
    if level == "restricted":
        for check in OVERRIDES.values():
            del checks[check]
        checks |= RESTRICTED
    elif level != "baseline":
        raise ValueError(level)
    return [v for check in checks.values() if (v := check(pod))]
