"""`cdk8s synth` (cdk8s.yaml -> python -m charts.main) writes what charts.main.synth writes, and
the committed bindings match the committed CRD file."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from charts_testspec import ROOT, SPEC_TOML

from charts.imports.io import ray as generated
from charts.validate import CRD_FILE, crd_schemas

# sha256 of KubeRay v1.7.0's ray-operator/config/crd/bases/ray.io_rayclusters.yaml and
# ray.io_rayjobs.yaml (tag commit 59d663ae), unmodified, one after the other.
KUBERAY_V170_CRDS = {"ray.io_rayclusters.yaml": "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1",
                     "ray.io_rayjobs.yaml": "01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5"}


def test_cdk8s_cli_synth_matches_the_function(tmp_path):
    # The app plans the repository's own jobs/: the function is called on the same folder (the
    # other chart tests synthesize the fixture copies).
    from charts.main import synth
    from charts_testspec import make_env

    expected = synth(make_env(), tmp_path / "function", root=ROOT, spec_text=SPEC_TOML)
    spec = tmp_path / "environment.toml"
    spec.write_text(SPEC_TOML)
    out = tmp_path / "dist"
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "ENV_FILE": str(spec), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    proc = subprocess.run([str(ROOT / "node_modules" / ".bin" / "cdk8s"), "synth", "--no-check-upgrade",
                           "--output", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = sorted(p.name for p in out.glob("*.k8s.yaml"))
    assert written == sorted(p.name for p in expected.files.values())
    for path in expected.files.values():
        assert (out / path.name).read_text() == path.read_text(), path.name
    assert [p.name for p in (out / "code").iterdir()] == [expected.code.name]


def properties(schema: dict) -> set[str]:
    return set(schema.get("properties", {}))


@pytest.mark.parametrize("binding, path", [
    ("RayJobSpec", ["spec"]),
    ("RayClusterSpec", ["spec"]),
    ("RayJobSpecRayClusterSpec", ["spec", "rayClusterSpec"]),
    ("RayClusterSpecWorkerGroupSpecs", ["spec", "workerGroupSpecs", "items"]),
])
def test_bindings_have_exactly_the_crd_fields(binding, path):
    # The bindings were generated from charts/crds/: same field names at every level we use.
    kind = "RayJob" if binding.startswith("RayJob") else "RayCluster"
    schema = crd_schemas()[kind]
    for step in path:
        schema = schema["items"] if step == "items" else schema["properties"][step]
    fields = {f.lower() for f in getattr(generated, binding).__jsii_name_mapping__.values()}
    assert fields == {f.lower() for f in properties(schema)}


def test_crd_file_is_the_unmodified_kuberay_crds():
    text = CRD_FILE.read_text()
    # The two upstream files, split where the second (the RayJob CRD) opens its document.
    second = text.index("\n---\napiVersion: apiextensions.k8s.io/v1\n") + 1
    parts = {"ray.io_rayclusters.yaml": text[:second], "ray.io_rayjobs.yaml": text[second:]}
    assert {name: hashlib.sha256(part.encode()).hexdigest() for name, part in parts.items()} == KUBERAY_V170_CRDS
    kinds = [d["spec"]["names"]["kind"] for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]  # libyaml: 2.3 MB
    assert kinds == ["RayCluster", "RayJob"]


@pytest.mark.subprocess
def test_a_failed_synth_keeps_the_last_good_dist(tmp_path):
    """``make cdk8s-synth`` with a broken input (here the spec; a broken jobs/*.toml fails the app
    the same way): the cdk8s CLI empties its output folder before it runs the app (cdk8s-cli
    ``lib/cli/cmds/synth.js``: ``fs.rmSync(outdir)``), so before the fix dist/ was gone."""
    import subprocess

    dist = tmp_path / "dist"
    (dist / "code").mkdir(parents=True)
    (dist / "raycluster.k8s.yaml").write_text("kind: RayCluster\n")
    broken = tmp_path / "environment.toml"
    broken.write_text("this is not toml = = \n")
    proc = subprocess.run(["make", "-o", "install", "cdk8s-synth", f"ENV_FILE={broken}", f"DIST={dist}",
                           f"CDK8S_STAGING={tmp_path / 'staging'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert (dist / "raycluster.k8s.yaml").read_text() == "kind: RayCluster\n", proc.stdout + proc.stderr
