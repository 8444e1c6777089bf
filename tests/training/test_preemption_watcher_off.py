"""Ray Train's PreemptionWatcher: ON for training runs (it is how a node drain's notice reaches
the workers), off for a netcheck, by the switch Ray Train itself reads.

Oracle: the installed Ray 2.58.0 wheel (``ray/train/v2/_internal/constants.py``): the switch's
name, its default (on), and that the driver's value reaches the controller and the workers
(``ENV_VARS_TO_PROPAGATE``). With the watcher on, Ray core logs "Actor with class name:
'PreemptionWatcher' ... has constructor arguments in the object store" on every run.
"""
from __future__ import annotations

import os

from training.metrics import PREEMPTION_WATCHER_ENV, without_preemption_watcher


def test_the_switch_is_ray_trains_own_and_propagates():
    from ray.train.v2._internal import constants

    assert PREEMPTION_WATCHER_ENV == constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR
    assert constants.DEFAULT_ENABLE_PREEMPTION_WATCHER is True
    assert PREEMPTION_WATCHER_ENV in constants.ENV_VARS_TO_PROPAGATE


def test_the_netcheck_turns_it_off_unless_the_user_set_it(monkeypatch):
    from ray._private import ray_constants

    monkeypatch.delenv(PREEMPTION_WATCHER_ENV, raising=False)
    without_preemption_watcher()
    assert ray_constants.env_bool(PREEMPTION_WATCHER_ENV, True) is False
    monkeypatch.setenv(PREEMPTION_WATCHER_ENV, "1")
    without_preemption_watcher()
    assert os.environ[PREEMPTION_WATCHER_ENV] == "1"


def test_a_training_driver_leaves_it_on_and_asks_for_an_elastic_size(monkeypatch, tmp_path):
    from ray._private import ray_constants

    from test_elastic_spot_ray import JOB
    from training.config import load_job_config
    from training.launch import build_trainer

    path = tmp_path / "elastic.toml"
    path.write_text(JOB.format(steps=4, min_nodes=1, storage=tmp_path / "store", run="r"))
    monkeypatch.delenv(PREEMPTION_WATCHER_ENV, raising=False)
    trainer = build_trainer(load_job_config(path))
    assert ray_constants.env_bool(PREEMPTION_WATCHER_ENV, True) is True
    # ray 2.58 train/v2/api/config.py: a (min, max) tuple is an elastic ScalingConfig
    scaling = trainer.scaling_config
    assert (scaling.min_workers, scaling.max_workers) == (2, 4) and scaling.elasticity_enabled
