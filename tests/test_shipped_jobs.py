"""The shipped jobs (jobs/*.toml) as products: each loads, passes the job's own ``--check`` and
the preflight, and synthesizes with the shipped environment.toml into RayJobs that validate.

Every other test starts from the copies in tests/fixtures/jobs (``fixture_paths.FIXTURE_JOBS``):
this module is the one an edit of a shipped job can break, and it covers a new shipped job
without an edit (each test is parametrized over the folder).
"""
from __future__ import annotations

import contextlib
import tomllib
import warnings
from pathlib import Path

import pytest
from fixture_paths import FIXTURE_JOBS
from fixtures_s3 import no_session_s3  # noqa: F401  (a fixture: the preflight's outcome must not hang on the session's S3)

from environment import load_environment
from training.contract import BUCKET_PLACEHOLDER, JOBS_DIR

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / JOBS_DIR).glob("*.toml"))
ENV_FILE = ROOT / "environment.toml"


def test_jobs_are_shipped():
    # an empty folder would parametrize every test below away and pass in silence
    assert SHIPPED


@pytest.mark.parametrize("job", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_job_loads(job, monkeypatch):
    from training.config import load_job_config

    monkeypatch.chdir(ROOT)  # the configs' relative paths (data, tokenizer) are from the root
    assert load_job_config(job.relative_to(ROOT)).name


@pytest.mark.parametrize("job", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_job_passes_its_check_and_says_what_it_did_not_read(job, monkeypatch, capsys):
    from training.__main__ import main

    monkeypatch.chdir(ROOT)
    rel = job.relative_to(ROOT).as_posix()
    code = main(["--config", rel, "--check"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith(f"{rel}: ok"), out.out
    if BUCKET_PLACEHOLDER in tomllib.loads(job.read_text()).get("data", {}).get("path", ""):
        assert "not read: {bucket} is filled in from environment.toml" in out.out


@pytest.mark.parametrize("job", SHIPPED, ids=lambda p: p.stem)
@pytest.mark.usefixtures("no_session_s3")
def test_a_shipped_job_passes_the_preflight(job, monkeypatch, capsys):
    from raytrain_eks.cli import main

    monkeypatch.chdir(ROOT)
    code = main(["preflight", "--env", str(ENV_FILE), "--job", job.relative_to(ROOT).as_posix(),
                 "--dist", "/nonexistent-dist"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "verdict    OK" in out.out


GPU_JOBS = sorted(p for p in [*SHIPPED, *(ROOT / JOBS_DIR / "family").glob("*.toml")]
                  if tomllib.loads(p.read_text()).get("parallel", {}).get("use_gpu"))


@pytest.mark.parametrize("job", GPU_JOBS, ids=lambda p: p.stem)
def test_a_shipped_gpu_job_writes_the_plan_the_search_picks(job):
    """Each shipped GPU training job is ``parallel.plan = "auto"`` and writes the plan search's pick
    (raytrain_eks/planning/plan_search.py) at the spec's size: submit would hand it no overrides,
    and the charts' manifests (which cannot run the search) run the same plan. The model's
    shapes: its published config.json (raytrain_eks/planning/measured_plan.py MODEL_CONFIGS).
    The smoke and netcheck jobs keep their written plans: the smoke proves the finetune's shape
    on synthetic data, the netcheck trains nothing; so does the DPO job (the search prices a
    next-token step, not DPO's extra reference forward)."""
    import contextlib

    from charts.jobs import plan_job
    from raytrain_eks.planning import measured_plan, plan_search
    from training.flops import ModelShapes

    env = load_environment(ENV_FILE)
    with contextlib.chdir(ROOT):
        config = plan_job(env, job, ROOT).config
    if config.kind == "netcheck" or config.is_infrastructure_check or config.train.objective != "sft":
        # the search prices a next-token step: DPO's reference forward is not in its model
        assert config.parallel.plan == "as_written"
        return
    assert config.parallel.plan == "auto"
    name = measured_plan.published_model(config.model.path)
    shapes = ModelShapes.from_hf_config({"model_type": "qwen2", **measured_plan.MODEL_CONFIGS[name]})
    found = plan_search.search(config, shapes, env.gpu_group(config.parallel.node_group))
    assert found.chosen is not None
    assert plan_search.overrides(config, found.chosen.job) == [], found.chosen.candidate.label()


@pytest.fixture(scope="module")
def shipped_synth(tmp_path_factory):
    """One synth of the shipped jobs with the shipped spec, as ``cdk8s synth`` runs it."""
    from charts.main import synth

    outdir = tmp_path_factory.mktemp("shipped-dist")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unlocked image warns; the charts label it instead
        result = synth(load_environment(ENV_FILE), outdir, root=ROOT, spec_text=ENV_FILE.read_text())
    return result


@pytest.mark.parametrize("job", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_job_synthesizes_its_rayjob(shipped_synth, job):
    import yaml

    from charts.main import rayjob_chart_name
    from environment.contract import run_folder

    by_path = {plan.config_path: plan for plan in shipped_synth.plans}
    plan = by_path[f"{JOBS_DIR}/{job.name}"]  # the entrypoint names the file as the archive holds it
    charts = [rayjob_chart_name(plan.name)]
    if plan.uses_gpu and plan.node_group == load_environment(ENV_FILE).primary_gpu_group.name:
        charts.append(rayjob_chart_name(plan.name, on_cluster=True))
    # the -on-cluster variant runs the same job in its on-cluster_<run> folder (charts/main.py)
    folder = f" --set checkpoint.run_name={run_folder(plan.config.run_name, on_cluster=True)}"
    config = f"--config {plan.config_path}"
    for chart, entrypoint in zip(charts, [plan.entrypoint, plan.entrypoint.replace(config, config + folder, 1)]):
        (rayjob,) = [d for d in yaml.safe_load_all(shipped_synth.files[chart].read_text()) if d]
        assert rayjob["kind"] == "RayJob" and rayjob["spec"]["entrypoint"] == entrypoint, chart


def test_the_shipped_manifests_validate(shipped_synth):
    from charts.main import RAYCLUSTER_CHART
    from charts.validate import manifest_errors

    version = load_environment(ENV_FILE).cluster.kubernetes_version
    checked, errors = manifest_errors(shipped_synth.files[RAYCLUSTER_CHART].parent, version)
    assert errors == [] and checked >= len(SHIPPED) + 1


@pytest.mark.subprocess  # SourceIdentity.capture asks git (charts/provenance.py)
def test_the_chart_tests_plan_and_pack_the_fixture_copies_not_the_shipped_jobs(tmp_path):
    """The separation: a synth from the fixture folder reads nothing under ROOT/jobs. Shown on a
    tree whose jobs/ is a broken copy of the shipped one: the fixture synth still plans, packs and
    hashes exactly the fixture files."""
    from charts.code_bundle import bundle_files
    from charts.jobs import plan_jobs
    from charts.provenance import SourceIdentity
    from training import contract

    tree = tmp_path / "tree"
    tree.mkdir()
    for folder in contract.SOURCE_PATHS:
        if (ROOT / folder).is_dir() and folder != JOBS_DIR:
            (tree / folder).symlink_to(ROOT / folder, target_is_directory=True)
    (tree / JOBS_DIR).mkdir()
    for job in SHIPPED:
        (tree / JOBS_DIR / job.name).write_text(job.read_text().replace("[train]", "[train"))  # not TOML any more
    env = load_environment(ENV_FILE)
    with contextlib.chdir(tree):
        plans = plan_jobs(env, FIXTURE_JOBS, tree)
    assert sorted(p.config_path for p in plans) == sorted(f"{JOBS_DIR}/{p.name}" for p in FIXTURE_JOBS.glob("*.toml"))
    packed = dict(bundle_files(tree, FIXTURE_JOBS))
    fixture_files = {f"{JOBS_DIR}/{p.name}": p for p in FIXTURE_JOBS.glob("*.toml")}
    assert {name: path for name, path in packed.items() if name.startswith(f"{JOBS_DIR}/")} == fixture_files
    assert not any(path.is_relative_to(tree / JOBS_DIR) for path in packed.values())
    hashed = contract.source_files(tree, FIXTURE_JOBS)
    assert not any(path.is_relative_to(tree / JOBS_DIR) for _, path in hashed)
    assert SourceIdentity.capture(tree, jobs=FIXTURE_JOBS).source_hash == contract.tree_hash(hashed)


def test_the_smoke_job_runs_the_shipped_finetunes_parallel_shape(shipped_synth):
    """The pipeline's Smoke and a user's first run exercise the long run's path: as synthesized
    for the shipped spec, the smoke job has the finetune's mesh (full shard over both nodes),
    sequence length, per-GPU micro batch and parallel settings, with more than one micro batch
    per step (parameters kept gathered across accumulation)."""
    by_name = {plan.config_path: plan.config for plan in shipped_synth.plans}
    smoke, finetune = by_name[f"{JOBS_DIR}/smoke.toml"], by_name[f"{JOBS_DIR}/finetune-qwen2.5-1.5b.toml"]
    shape = lambda job: (job.parallel.strategy, job.parallel.num_workers, job.parallel.workers_per_node,
                         job.parallel.activation_checkpointing, job.parallel.keep_params_gathered,
                         job.parallel.grad_reduce_dtype, job.parallel.compile, job.train.seq_len,
                         job.train.micro_batch_size)
    assert shape(smoke) == shape(finetune)
    assert smoke.parallel.strategy == "full_shard" and smoke.num_nodes > 1 and smoke.parallel.workers_per_node > 1
    assert smoke.grad_accum_steps > 1 and smoke.data.kind == "synthetic"


def test_the_network_is_measured_by_the_netcheck_job_and_first_by_the_smoke_job(shipped_synth):
    """jobs/netcheck.toml is a netcheck; the smoke job (the pipeline's Smoke stage) measures the
    network before it trains; both judge against the GPU group's nominal link, which the charts
    take from environment/instances.py (its one definition), over EFA."""
    env = load_environment(ENV_FILE)
    by_name = {plan.config_path: plan for plan in shipped_synth.plans}
    netcheck, smoke = by_name[f"{JOBS_DIR}/netcheck.toml"], by_name[f"{JOBS_DIR}/smoke.toml"]
    assert netcheck.config.kind == "netcheck" and smoke.config.kind == "train" and smoke.config.netcheck.run_first
    for plan in (netcheck, smoke):
        link = env.gpu_group(plan.node_group).instance.network_gbps
        assert f"netcheck.link_gbps={link}" in plan.overrides and plan.config.netcheck.link_gbps == link > 0
        assert plan.config.evidence.require_transport == "efa" and plan.config.netcheck.compare_socket
    assert not by_name[f"{JOBS_DIR}/finetune-qwen2.5-1.5b.toml"].config.measures_network


def test_the_on_cluster_rayjobs_write_on_cluster_folders(tmp_path):
    """The long-lived cluster's role may write only ``runs/on-cluster_<run>/``
    (environment.contract.run_folder; tests/infra/test_run_isolation.py): every shipped
    ``-on-cluster`` RayJob names such a folder, every RayJob with its own cluster its own name."""
    import yaml

    from charts.main import synth
    from environment import load_environment
    from environment.contract import ON_CLUSTER_FOLDER

    synth(load_environment(ROOT / "environment.toml"), tmp_path)
    found = 0
    for path in sorted(tmp_path.glob("rayjob-*.k8s.yaml")):
        [job] = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "RayJob"]
        names = [w.split("=", 1)[1] for w in job["spec"]["entrypoint"].split() if w.startswith("checkpoint.run_name=")]
        if "clusterSelector" in job["spec"]:
            found += 1
            assert names and names[-1].startswith(ON_CLUSTER_FOLDER), (path.name, names)
        else:
            assert not names or not names[-1].startswith(ON_CLUSTER_FOLDER), (path.name, names)
    assert found
