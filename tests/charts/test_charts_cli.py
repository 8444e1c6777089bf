"""`cdk8s synth` (cdk8s.yaml -> python -m charts.main) writes what charts.main.synth writes, and
the committed bindings match the committed CRD file."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from charts_testspec import ROOT, SPEC_TOML

from charts.imports.io import ray as generated
from charts.validate import CRD_FILE, crd_schemas

SHARED_CRDS = ROOT.parent / "shared" / "kuberay" / "v1.7.0"


def test_cdk8s_cli_synth_matches_the_function(default_synth, tmp_path):
    spec = tmp_path / "environment.toml"
    spec.write_text(SPEC_TOML)
    out = tmp_path / "dist"
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "ENV_FILE": str(spec), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    proc = subprocess.run([str(ROOT / "node_modules" / ".bin" / "cdk8s"), "synth", "--no-check-upgrade",
                           "--output", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = sorted(p.name for p in out.glob("*.k8s.yaml"))
    assert written == sorted(p.name for p in default_synth.result.files.values())
    for path in default_synth.result.files.values():
        assert (out / path.name).read_text() == path.read_text(), path.name
    assert [p.name for p in (out / "code").iterdir()] == [default_synth.result.code.name]


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


@pytest.mark.skipif(not SHARED_CRDS.is_dir(), reason="the pinned KubeRay CRDs are not next to this checkout")
def test_crd_file_is_the_unmodified_kuberay_crds():
    expected = "".join((SHARED_CRDS / f).read_text() for f in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"))
    assert CRD_FILE.read_text() == expected
    kinds = [d["spec"]["names"]["kind"] for d in yaml.safe_load_all(expected) if d]
    assert kinds == ["RayCluster", "RayJob"]
