"""Every synthesized RayCluster/RayJob against the real KubeRay CRD schema (unknown fields
REJECTED), their pod templates against the Kubernetes schema, and broken objects caught."""
from __future__ import annotations

import copy

import pytest
from charts.validate import crd_errors, pod_template_errors


def all_objects(synth):
    return [(chart, obj) for chart, objs in synth.docs.items() for obj in objs]


def test_every_object_is_a_served_kuberay_kind_or_a_network_policy(default_synth):
    kinds = {(o["apiVersion"], o["kind"]) for _, o in all_objects(default_synth)}
    assert kinds == {("ray.io/v1", "RayCluster"), ("ray.io/v1", "RayJob"),
                     ("networking.k8s.io/v1", "NetworkPolicy")}


@pytest.mark.parametrize("variant", ["default_synth", "large_synth"])
def test_manifests_validate_strictly_against_the_crds(variant, request):
    synth = request.getfixturevalue(variant)
    for chart, obj in all_objects(synth):
        if obj["apiVersion"].startswith("ray.io/"):
            assert crd_errors(obj) == [], chart


@pytest.mark.parametrize("variant", ["default_synth", "large_synth"])
def test_pod_templates_validate_against_the_kubernetes_schema(variant, request):
    synth = request.getfixturevalue(variant)
    checked = 0
    for chart, obj in all_objects(synth):
        assert pod_template_errors(obj, synth.env.cluster.kubernetes_version) == [], chart
        checked += obj["kind"] == "RayCluster" or "rayClusterSpec" in obj["spec"]
    assert checked >= 4  # the RayCluster and every own-cluster RayJob
    submitters = [o for _, o in all_objects(synth) if o["kind"] == "RayJob"]
    assert submitters and all("submitterPodTemplate" in o["spec"] for o in submitters)


def test_a_misspelled_field_is_caught_only_by_the_strict_schema(default_synth):
    # Given a RayJob whose worker container says "resource" instead of "resources"
    broken = copy.deepcopy(default_synth.one("rayjob-smoke"))
    container = broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    container["resource"] = container.pop("resources")
    # Then the raw CRD schema lets it through (the API server would drop the GPUs silently) ...
    assert crd_errors(broken, strict_mode=False) == []
    # ... and the strict one names it
    errors = crd_errors(broken)
    assert len(errors) == 1 and "'resource' was unexpected" in errors[0]
    assert errors[0].startswith("spec/rayClusterSpec/workerGroupSpecs/0/template/spec/containers/0:")
    # And the Kubernetes pod schema agrees
    assert any("resource" in e for e in pod_template_errors(broken, "1.36"))


@pytest.mark.parametrize("mutate, expected", [
    (lambda o: o["spec"]["workerGroupSpecs"][0].update(replicas="two"), "'two' is not of type 'integer'"),
    (lambda o: o["spec"].update(rayVersionn="2.58.0"), "'rayVersionn' was unexpected"),
    (lambda o: o["spec"]["headGroupSpec"].pop("template"), "'template' is a required property"),
    (lambda o: o["spec"]["workerGroupSpecs"][0]["template"]["spec"]["tolerations"][0].update(tolerationSeconds="1h"),
     "'1h' is not of type 'integer'"),
])
def test_wrong_types_and_names_in_the_raycluster_are_caught(default_synth, mutate, expected):
    broken = copy.deepcopy(default_synth.one("raycluster"))
    mutate(broken)
    assert any(expected in e for e in crd_errors(broken)), crd_errors(broken)


def test_a_wrong_type_in_a_rayjob_field_is_caught(default_synth):
    broken = copy.deepcopy(default_synth.one("rayjob-smoke-on-cluster"))
    broken["spec"]["backoffLimit"] = "once"
    assert crd_errors(broken) == ["spec/backoffLimit: 'once' is not of type 'integer'"]


def test_preserve_unknown_fields_stay_open():
    # Where the CRD says x-kubernetes-preserve-unknown-fields, strictness must not close it.
    from charts.validate import strict

    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}},
                                                     "x-kubernetes-preserve-unknown-fields": True}}}
    closed = strict(schema)
    assert closed["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["a"]


def test_validate_cli_passes_dist_and_names_a_broken_file(default_synth, tmp_path):
    import subprocess
    import sys

    import yaml
    from charts_testspec import ROOT, SPEC_TOML

    spec = tmp_path / "environment.toml"
    spec.write_text(SPEC_TOML)
    outdir = default_synth.result.files["raycluster"].parent
    run = lambda d: subprocess.run([sys.executable, "-m", "charts.validate", str(d), "--env", str(spec)],
                                   cwd=ROOT, capture_output=True, text=True, timeout=120)
    ok = run(outdir)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("OK (KubeRay CRDs strict, Kubernetes 1.36 strict)")
    assert ok.stdout.startswith(f"{sum(map(len, default_synth.docs.values()))} objects")

    broken = copy.deepcopy(default_synth.one("raycluster"))
    broken["spec"]["headGroupSpec"]["rayStartParms"] = broken["spec"]["headGroupSpec"].pop("rayStartParams")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "raycluster.k8s.yaml").write_text(yaml.safe_dump(broken))
    bad = run(tmp_path / "bad")
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[0] == ("raycluster.k8s.yaml: spec/headGroupSpec: Additional properties are not "
                                          "allowed ('rayStartParms' was unexpected)")
