"""What a RayJob carries about its own origin: git commit + dirty flag, source hash, the spec's
text, and the hash of the very file it is in (computed without circularity)."""
from __future__ import annotations

import base64
import subprocess

import yaml
from charts_testspec import ROOT, SPEC_TOML
from fixture_paths import FIXTURE_JOBS

from training import contract


def _runtime_env(synth, chart: str) -> dict:
    return yaml.safe_load(synth.one(chart)["spec"]["runtimeEnvYAML"])["env_vars"]


def test_each_rayjob_carries_the_hash_of_its_own_file(default_synth):
    result = default_synth.result
    assert set(result.manifest_hashes) == set(result.files) - {"raycluster", "network-policy"}
    for chart, digest in result.manifest_hashes.items():
        text = result.files[chart].read_text()
        assert _runtime_env(default_synth, chart)[contract.ENV_MANIFEST_HASH] == digest
        assert contract.manifest_hash(text) == digest  # recomputable from the file as written
        assert _runtime_env(default_synth, chart)[contract.ENV_MANIFEST_NAME] == chart
        # any other byte changes it
        assert "submissionMode: K8sJobMode" in text
        assert contract.manifest_hash(text.replace("submissionMode: K8sJobMode", "submissionMode: HTTPMode")) != digest


def test_git_identity_and_spec_text_travel_to_the_job(default_synth):
    env_vars = _runtime_env(default_synth, "rayjob-local")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    # The synth packs the fixture jobs as jobs/: they stand in for ROOT/jobs in both checks.
    paths = [p for p in contract.SOURCE_PATHS if p != contract.JOBS_DIR] + [FIXTURE_JOBS.relative_to(ROOT).as_posix()]
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *paths],
                                capture_output=True, text=True).stdout.strip())
    assert env_vars[contract.ENV_GIT_COMMIT] == head
    assert env_vars[contract.ENV_GIT_DIRTY] == ("true" if dirty else "false")
    labels = default_synth.one("rayjob-local")["metadata"]["labels"]
    assert labels["raytrain.io/git-commit"] == head
    assert base64.b64decode(env_vars[contract.ENV_SPEC_TEXT]).decode() == SPEC_TOML
    assert env_vars[contract.ENV_SOURCE_HASH] == contract.tree_hash(contract.source_files(ROOT, FIXTURE_JOBS))


def test_gpu_workers_learn_their_node_from_the_downward_api_and_their_zone_from_the_spec(default_synth):
    spec = default_synth.one("rayjob-smoke")["spec"]["rayClusterSpec"]
    worker_env = {e["name"]: e for e in spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]}
    assert worker_env[contract.ENV_NODE_NAME]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert worker_env[contract.ENV_AZ]["value"] == default_synth.env.cluster.gpu_availability_zone
    head_env = {e["name"] for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert contract.ENV_NODE_NAME in head_env and contract.ENV_AZ not in head_env
