"""``image.pull_through_cache``: the one pull reference every consumer reads, the spec's
one-line refusals of a cache it cannot build, and the image-pull model ``summary`` and the
preflight print (both paths from the named constants: a model, checked for its arithmetic and its
shape; the figures themselves are estimates)."""
from __future__ import annotations

import copy
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from environment import SpecError, environment_from_dict
from environment import image_source as m
from environment.image_source import cache_prefix, pull_reference, pull_repository
from spec_template import template_raw
from toml_writer import toml_text

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "111122223333"
DIGEST = "sha256:" + "ab" * 32


def _raw(**image) -> dict:
    raw = copy.deepcopy(template_raw())
    raw["cluster"]["account"] = ACCOUNT
    raw["image"].update(image)
    return raw


def test_the_cache_keeps_the_upstream_path_and_the_same_digest():
    env = environment_from_dict(_raw(pull_through_cache=True, digest=DIGEST))
    assert cache_prefix("raytrain") == "raytrain-ecr-public"
    assert pull_repository(env) == (f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/raytrain-ecr-public/"
                                    "deep-learning-containers/ray")
    assert pull_reference(env) == pull_repository(env) + "@" + DIGEST
    # lock and the image watcher keep resolving the upstream: the same digest
    assert env.image.reference == f"public.ecr.aws/deep-learning-containers/ray@{DIGEST}"


def test_without_the_cache_the_pods_pull_the_upstream_reference():
    env = environment_from_dict(_raw(digest=DIGEST))
    assert pull_reference(env) == env.image.reference and pull_repository(env) == env.image.repository
    unlocked = environment_from_dict(_raw(pull_through_cache=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert pull_reference(unlocked).endswith("/deep-learning-containers/ray:train-ml-cuda-v1.1.0")


@pytest.mark.parametrize(("change", "says"), [
    ({"cluster": {"account": ""}}, "needs cluster.account"),
    ({"image": {"repository": "ghcr.io/acme/ray"}}, "caches only public.ecr.aws but image.repository is on ghcr.io"),
    ({"cluster": {"region": "cn-north-1", "availability_zones": ["cn-north-1a", "cn-north-1b"],
                  "gpu_availability_zone": "cn-north-1a"}}, "is not offered in cn-north-1"),
    ({"cluster": {"name": "a-cluster-name-of-twenty"}}, "needs a cluster.name of at most 19 characters"),
])
def test_a_cache_the_spec_cannot_build_is_refused_in_one_line(change, says):
    raw = _raw(pull_through_cache=True)
    raw["storage"]["bucket_name"] = "some-bucket-name"
    for section, values in change.items():
        raw[section].update(values)
    with pytest.raises(SpecError) as caught:
        environment_from_dict(raw, "env.toml")
    line = str(caught.value)
    assert line.startswith("env.toml: image.pull_through_cache: True") and says in line and "\n" not in line


def test_summary_refuses_it_in_one_line_naming_the_file(tmp_path):
    raw = tomllib.loads((ROOT / "environment.toml").read_text())
    raw["image"]["pull_through_cache"] = True  # the shipped account is empty
    spec = tmp_path / "environment.toml"
    spec.write_text(toml_text(raw))
    out = subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "summary", "--env", str(spec)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"{spec}: image.pull_through_cache: True needs cluster.account" in out.stderr


def _env(**group):
    raw = copy.deepcopy(template_raw())
    raw["cluster"]["account"] = "111122223333"
    raw["gpu_node_groups"][0].update(group)
    return environment_from_dict(raw)


def test_the_nat_charges_per_node_start_and_the_cache_by_the_hour():
    env = _env()  # 0 -> 2 g6.12xlarge per job, two VPC AZs
    nat, cache = m.pull_paths(env)
    assert nat.nat_usd == pytest.approx(m.IMAGE_COMPRESSED_GB * m.NAT_USD_PER_GB) and nat.fixed_usd_per_hour == 0
    assert cache.nat_usd == 0
    assert cache.fixed_usd_per_hour == pytest.approx(
        2 * 2 * m.INTERFACE_ENDPOINT_USD_PER_AZ_HOUR + m.IMAGE_COMPRESSED_GB * m.ECR_STORAGE_USD_PER_GB_MONTH / 730)
    assert m.break_even_starts_per_day(env) == pytest.approx(cache.fixed_usd_per_hour * 24 / nat.nat_usd)
    # two nodes share the NAT's baseline without slowing down; sixteen do not
    assert nat.minutes == pytest.approx(cache.minutes)
    many_nat, many_cache = m.pull_paths(_env(instance_type="g6.12xlarge", max_nodes=16))
    assert many_nat.minutes > many_cache.minutes == pytest.approx(cache.minutes)


def test_the_lines_mark_the_path_the_spec_chose():
    env = _env()
    lines = m.pull_lines(env)
    assert lines[0].startswith("image pull") and "2 node(s) start per job" in lines[0]
    assert lines[1].lstrip().startswith("* public registry via NAT") and "NAT data 0.90 USD/node (1.80 a job)" in lines[1]
    assert lines[2].lstrip().startswith("ECR pull-through cache") and "fixed 0.043 USD/hour" in lines[2]
    raw = copy.deepcopy(template_raw())
    raw["cluster"]["account"] = "111122223333"
    raw["image"]["pull_through_cache"] = True
    cached = m.pull_lines(environment_from_dict(raw))
    assert cached[2].lstrip().startswith("* ECR pull-through cache") and "= true" in cached[3]
