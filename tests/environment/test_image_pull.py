"""The image-pull model ``summary`` and the preflight print: both paths from the named constants
(a model, checked for its arithmetic and its shape; the figures themselves are estimates)."""
from __future__ import annotations

import copy

import pytest

from environment import environment_from_dict
from environment import image_pull as m
from spec_template import template_raw


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
