"""Every kubectl call of the pipeline is bounded (kube.py): ``--request-timeout`` on each call,
``delete --wait --timeout``, and the process itself, so a stuck API server or finalizer ends in
a KubeError (recorded and rolled back by the step) rather than at the CodeBuild timeout."""
from __future__ import annotations

import sys

import pytest

from raytrain_eks.pipeline.kube import DELETE_TIMEOUT_S, KubeError, Kubectl


def script(tmp_path, body: str) -> str:
    path = tmp_path / "kubectl"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_each_call_carries_a_request_timeout_and_a_delete_a_wait_bound(tmp_path):
    kube = Kubectl("ray", script(tmp_path, "print(' '.join(sys.argv[1:]))"))
    assert kube.run("get", "pods").split() == ["-n", "ray", "get", "pods", "--request-timeout=60s"]
    out = tmp_path / "args"
    kube = Kubectl("ray", script(tmp_path, f"open({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))"))
    kube.delete("rayjob", "smoke")
    args = out.read_text().split()
    assert "--wait=true" in args and f"--timeout={DELETE_TIMEOUT_S}s" in args and "--request-timeout=60s" in args


def test_a_kubectl_that_never_returns_is_a_kube_error(tmp_path):
    # a process that outlives its bound (here made small: request timeout 1 s, margin 1 s)
    kube = Kubectl("ray", script(tmp_path, "time.sleep(3600)"), request_timeout_s=1, margin_s=1)
    with pytest.raises(KubeError, match=r"did not finish in 2 s"):
        kube.run("get", "raycluster", "raytrain")
