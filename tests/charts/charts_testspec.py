"""The specs the chart tests synthesize from, and the synth helper (a plain module with a unique
name: ``from conftest import`` would pick whichever conftest another test folder loaded first).

The bindings import alone costs ~5 s without bytecode caching, a synth ~2 s more: conftest.py
runs each variant ONCE per session. The specs are written here, not read from environment.toml:
a user editing their environment must not break the snapshots. The jobs are the fixture
copies (``FIXTURE_JOBS``) for the same reason: editing a shipped job breaks no chart test.
``default`` = the shipped defaults (2 x g6.12xlarge) with an account and a locked image (the
digest is a test value, not a real image); ``large`` = 4 x g6.48xlarge, unlocked.
"""
from __future__ import annotations

import copy
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml

from environment import Environment, environment_from_dict
from fixture_paths import FIXTURE_JOBS

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "111122223333"
TEST_DIGEST = "sha256:" + "0123456789abcdef" * 4  # not a real image: tests only

SPEC_TOML = f"""
[cluster]
name = "raytrain"
account = "{ACCOUNT}"
region = "us-east-1"
availability_zones = ["us-east-1a", "us-east-1b"]
gpu_availability_zone = "us-east-1a"
kubernetes_version = "1.36"
public_access_cidrs = ["203.0.113.0/24"]

[system_node_group]
instance_type = "m7i.xlarge"
nodes = 1

[[gpu_node_groups]]
name = "gpu"
instance_type = "g6.12xlarge"
min_nodes = 2
desired_nodes = 2
max_nodes = 2

[image]
repository = "public.ecr.aws/deep-learning-containers/ray"
tag = "train-ml-cuda-v1.1.0"
digest = "{TEST_DIGEST}"
ray_version = "2.58.0"

[ray]
namespace = "ray"
service_account = "ray-train"
"""


def spec_raw() -> dict:
    return tomllib.loads(SPEC_TOML)


def make_env(raw: dict | None = None, **group_changes) -> Environment:
    """The test spec, with changes to its (first) GPU group."""
    raw = copy.deepcopy(raw or spec_raw())
    raw["gpu_node_groups"][0].update(group_changes)
    return environment_from_dict(raw, source="test-environment.toml")


def large_env() -> Environment:
    raw = spec_raw()
    raw["image"]["digest"] = ""
    return make_env(raw, instance_type="g6.48xlarge", min_nodes=4, desired_nodes=4, max_nodes=4)


@dataclass
class Synth:
    env: Environment
    result: object  # charts.main.SynthResult
    docs: dict[str, list[dict]]
    """Chart name -> its objects."""

    def one(self, chart: str) -> dict:
        (obj,) = self.docs[chart]
        return obj


def run_synth(env: Environment, outdir: Path, spec_text: str = "") -> Synth:
    from charts.main import synth

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unlocked image warns; the charts label it instead
        result = synth(env, outdir, root=ROOT, spec_text=spec_text, jobs=FIXTURE_JOBS)
    docs = {name: [d for d in yaml.safe_load_all(path.read_text()) if d]
            for name, path in result.files.items()}
    return Synth(env=env, result=result, docs=docs)
